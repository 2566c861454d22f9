"""What the runtime's driver (``runtime.driver``) asks of a role: the small protocol every role
answers, and what it may do besides (:class:`Extras`), with the driver's default for each."""

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

StopCheck = Callable[[], bool]


@dataclass(frozen=True)
class StepInputs:
    """What a role's steps read: ``flows`` (every stripe of them), one stream per producer in
    ``sources`` (one stream from whoever publishes when empty), ``per_step`` consecutive
    messages of each stream to a step; the peers may run ``behind`` steps further ahead while
    this role is left out of theirs (a replicas quorum going on without its cluster)."""

    flows: Sequence[topology.Flow]
    sources: tuple[str, ...] = ()
    per_step: int = 1
    behind: int = 0

    @property
    def streams(self) -> int:
        return max(1, len(self.sources))

    def awaited(self) -> str:
        """What a step waits for, as a person says it: ``reply-head-0 from cluster-b``, or
        ``gen-results from gen-0, gen-1 on cluster-a``."""
        names = ", ".join(dict.fromkeys(f.name for f in self.flows))
        clusters = ", ".join(sorted({f.src_cluster for f in self.flows}))
        return f"{names} from {', '.join(self.sources)} on {clusters}" if self.sources else f"{names} from {clusters}"


def _nothing(*_: object) -> None:
    return None


def _never(*_: object) -> bool:
    return False


Members = Callable[[tuple[Received | None, ...]], tuple[bool, ...] | None]


@dataclass(frozen=True)
class Extras:
    """What a role may do besides :class:`StepRole`, each field the role's own method or the
    driver's default (the middleware hooks of dramatiq's worker, in our loop). A role gives
    its own from :meth:`StepRole.extras`, by keyword: mypy checks each name and signature.

    ``admit``: raise a ``NebulaError`` to dead-letter a message before it is ordered; what it
    returns is ignored (default: every message of a source stream is ordered).
    ``handle_other``: True when a message is not a step's and was settled or rejected there
    (default: every message is a step's).
    ``unsaved``: whether anything needs a final checkpoint beyond the applied steps (default: no).
    ``more_to_do``: keep going after the last step, e.g. for evaluation batches (default: no).
    ``after_training``: once every step is done and checkpointed, not after a stop (default: nothing).
    ``resume_store``: the store to restore from, e.g. another run's for a hot start (None: the worker's).
    ``members``: which streams the next step takes, given each stream's first message waiting
    for it (None where none has come yet), or None while the step must wait; a stream left out
    has its message dropped (acked with the next checkpoint) or, not come yet, dropped when it
    comes (None: every stream, once each has its messages).
    """

    admit: Callable[[Received], object] = _nothing
    handle_other: Callable[[OrderedInbox, Received], bool] = _never
    unsaved: Callable[[], bool] = _never
    more_to_do: Callable[[], bool] = _never
    after_training: Callable[[], None] = _nothing
    resume_store: Callable[[], CheckpointStore] | None = None
    members: Members | None = None


class StepRole(Protocol):
    """What the driver asks of every role. ``total``: the steps to train; ``in_flight``: messages
    a peer may have sent ahead of the next step."""

    total: int
    in_flight: int

    def inputs(self) -> StepInputs:
        """The flows and streams a step reads."""

    def extras(self) -> Extras:
        """What the role does besides the step (``Extras()``: the driver's defaults)."""

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
