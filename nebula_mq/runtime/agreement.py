"""How a worker agrees with the other ranks of its group: one object for every role.

A worker alone decides for itself. The ranks of a data-parallel group (a split side of
``head_ranks`` processes, ELECTRA's discriminator ranks) must agree on four things,
or one rank waits for ever in a collective the others never enter:

* **where to start**: the newest checkpoint every rank holds (a MIN over the ranks), so
  a rank that rolls back still finds every message it needs unacked;
* **when to stop**: each rank's stop request rides in the step's collective (a vote,
  :meth:`Agreement.voted`); the group stops at the step where any rank asked;
* **when to ack**: every rank holds a checkpoint before any rank acks what it covers
  (a barrier between the checkpoint and its acks, ``Worker.commit``);
* **leaving alone**: a rank asked to stop that has had nothing to apply for
  :data:`IDLE_POLLS_TO_STOP` polls leaves without the group (its peers are stopping
  too), and then writes no checkpoint that would need a barrier.

The gradients' all-reduce stays with the framework (``models.frameworks``); the group it
runs on is the one given here. Every collective completes or ends the process within the
group's timeout (``models.collectives.deadline``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from nebula_mq.errors import CheckpointError
from nebula_mq.runtime.signals import StopFlag

# A rank of a group that was asked to stop and has had nothing to apply for this many
# polls leaves without waiting for its group's agreement: its peers are stopping too.
IDLE_POLLS_TO_STOP = 2


class Collective(Protocol):
    """The collectives an agreement needs (paddle's and torch's groups have them)."""

    def min_int(self, value: int) -> int:
        """The smallest ``value`` over the ranks."""

    def barrier(self) -> None:
        """Wait until every rank is here."""


class Agreement:
    """A worker's agreements with its group; alone (``group`` None), it agrees with itself."""

    def __init__(self, stop: StopFlag, group: Collective | None = None,
                 leaves_alone: Callable[[], bool] | None = None) -> None:
        """``leaves_alone``: whether this rank may leave without its group once asked to stop and
        idle (default: yes); a rank whose idleness says nothing of its peers' (it waits for
        another rank's word) answers from that word."""
        self.stop = stop
        self.group = group
        self.leaves_alone = leaves_alone or (lambda: True)
        self.agreed_stop = False  # a rank of the group voted to stop at the last step

    def start_step(self, steps: Sequence[int], worker_id: str) -> int | None:
        """The checkpoint to resume from, of the ``steps`` this worker holds (None: start over)."""
        if self.group is None:
            return steps[-1] if steps else None
        start = self.group.min_int(steps[-1] if steps else -1)
        if start < 0:
            return None
        if start not in steps:
            raise CheckpointError(f"{worker_id} has no checkpoint at its group's step {start} "
                                  f"(it has {list(steps)}); restore the group's checkpoints or start over")
        return start

    def voted(self, collective: Callable[[list[float]], np.ndarray], *riders: float) -> np.ndarray:
        """The step's ``collective`` (a sum over the ranks of the values it is given) run on
        ``riders`` and, last, this rank's stop vote: the group stops after this step if any rank
        asked. Returns the riders summed."""
        summed = collective([*riders, float(self.stop.is_set())])
        self.agreed_stop = float(summed[-1]) > 0
        return summed[:-1]

    def stopping(self, idle_polls: int = 0) -> bool:
        """Whether to stop between steps now."""
        if self.group is None:
            return self.stop.is_set()
        return self.agreed_stop or (self.stop.is_set() and idle_polls >= IDLE_POLLS_TO_STOP and self.leaves_alone())

    def may_checkpoint(self) -> bool:
        """Whether a final checkpoint may be written now: alone, or at a step the group agreed
        to stop at (a rank leaving alone must not wait in a barrier for peers that are not
        checkpointing; what it applied since its last checkpoint is still unacked)."""
        return self.group is None or self.agreed_stop

    def before_ack(self) -> None:
        """Between a checkpoint and the acks it allows: every rank holds its checkpoint."""
        if self.group is not None:
            self.group.barrier()
