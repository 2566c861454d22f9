"""What the runtime's driver (``runtime.driver``) asks of a role: the small protocol every role
answers, and the optional hooks (:class:`RoleExtras`) with the driver's default for each."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from nebula_mq import topology
from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.checkpoint import Checkpoint, CheckpointStore

if TYPE_CHECKING:
    from nebula_mq.runtime.ordered import OrderedInbox
    from nebula_mq.runtime.worker import Worker

StopCheck = Callable[[], bool]


@dataclass(frozen=True)
class StepInputs:
    """What a role's steps read: ``flows`` (every stripe of them), one stream per producer in
    ``sources`` (one stream from whoever publishes when empty), ``per_step`` consecutive
    messages of each stream to a step."""

    flows: Sequence[topology.Flow]
    sources: tuple[str, ...] = ()
    per_step: int = 1

    @property
    def streams(self) -> int:
        return max(1, len(self.sources))

    def awaited(self) -> str:
        """What a step waits for, as a person says it: ``reply-head-0 from cluster-b``, or
        ``gen-results from gen-0, gen-1 on cluster-a``."""
        names = ", ".join(dict.fromkeys(f.name for f in self.flows))
        clusters = ", ".join(sorted({f.src_cluster for f in self.flows}))
        return f"{names} from {', '.join(self.sources)} on {clusters}" if self.sources else f"{names} from {clusters}"


class StepRole(Protocol):
    """What the driver asks of every role. ``total``: the steps to train; ``in_flight``: messages
    a peer may have sent ahead of the next step. A role may also answer any of
    :class:`RoleExtras`."""

    total: int
    in_flight: int

    def inputs(self) -> StepInputs:
        """The flows and streams a step reads."""

    def open(self) -> None:
        """Declare the queues, open the outboxes, join the group (before the restore)."""

    def close(self) -> None:
        """Close what :meth:`open` opened."""

    def produce(self, stopping: StopCheck) -> None:
        """Send what may be sent before the next wait (up to where ``stopping()`` says stop)."""

    def apply(self, parts: tuple[Received, ...]) -> Mapping[str, float]:
        """Apply one step's messages (``per_step`` of each stream, streams in ``sources``
        order; the worker's ``step`` is the step's index); returns the step's values."""

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays and metadata that resume the role at the worker's step."""

    def load(self, ck: Checkpoint) -> None:
        """Resume from ``ck`` (the worker's step is already ``ck.step``)."""


class RoleExtras(Protocol):
    """What a role may answer besides :class:`StepRole`; the driver's default stands for each
    method a role leaves out (the middleware hooks of dramatiq's worker, in our loop)."""

    def admit(self, received: Received) -> None:
        """Raise a ``NebulaError`` to dead-letter ``received`` before it is ordered (default:
        every message of a source stream is ordered)."""

    def handle_other(self, inbox: OrderedInbox, received: Received) -> bool:
        """True when ``received`` is not a step's message and was settled or rejected here
        (default: every message is a step's)."""

    def unsaved(self) -> bool:
        """Whether anything needs a final checkpoint beyond the applied steps (default: no)."""

    def more_to_do(self) -> bool:
        """Keep going after the last step, e.g. for evaluation batches (default: no)."""

    def after_training(self) -> None:
        """Once every step is done and checkpointed, not after a stop (default: nothing)."""

    def resume_store(self) -> CheckpointStore:
        """The store to restore from, e.g. another run's for a hot start (default: the worker's)."""

    def members(self, heads: tuple[Received | None, ...]) -> tuple[bool, ...] | None:
        """Which streams the next step takes, given each stream's first message waiting for it
        (None where none has come yet), or None while the step must wait; a stream left out
        has its message dropped (acked with the next checkpoint) or, not come yet, dropped when
        it comes. Default: every stream, once each has its messages."""

    def left_behind(self) -> int:
        """Steps the peers may run ahead while this role is left out of theirs (default 0)."""


@dataclass(frozen=True)
class Extras:
    """A role's :class:`RoleExtras`, each method or the driver's default, looked up once."""

    admit: Callable[[Received], None]
    handle_other: Callable[[OrderedInbox, Received], bool]
    unsaved: Callable[[], bool]
    more_to_do: Callable[[], bool]
    after_training: Callable[[], None]
    resume_store: Callable[[], CheckpointStore]
    members: Callable[[tuple[Received | None, ...]], tuple[bool, ...] | None] | None
    left_behind: Callable[[], int]

    @classmethod
    def of(cls, role: StepRole, worker: Worker) -> Extras:
        def no(*_: object) -> bool:
            return False

        def nothing(*_: object) -> None:
            return None

        return cls(getattr(role, "admit", nothing), getattr(role, "handle_other", no), getattr(role, "unsaved", no),
                   getattr(role, "more_to_do", no), getattr(role, "after_training", nothing),
                   getattr(role, "resume_store", lambda: worker.store), getattr(role, "members", None),
                   getattr(role, "left_behind", lambda: 0))
