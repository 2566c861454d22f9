"""The runtime's loop (``runtime.loop``) for a role whose steps are the in-order messages of one flow.

:class:`SteppedWorker` also owns the step count and the checkpoint schedule. A role says only:

* what it sends before it waits (:meth:`~SteppedWorker.produce`; a split head
  sends activations up to its window);
* what it does with the next in-order message (:meth:`~SteppedWorker.apply`,
  which returns the step's values), and which messages it refuses
  (:meth:`~SteppedWorker.admit`) or handles outside the ordered stream
  (:meth:`~SteppedWorker.handle_other`);
* what its state is (:meth:`~SteppedWorker.state`, :meth:`~SteppedWorker.load`).

The runtime does the rest, here and nowhere else: it restores the latest
checkpoint, orders and dedupes the flow with one counter (the step:
:class:`~nebula_mq.runtime.ordered.OrderedInbox`), counts steps, checkpoints
every ``checkpoint_every`` steps and at the last, acks only what a durable
checkpoint holds (``Worker.commit``), and stops between messages when a signal
asks it to, after checkpointing what was applied.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

from nebula_mq import topology
from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.checkpoint import Checkpoint
from nebula_mq.runtime.logs import get_logger
from nebula_mq.runtime.ordered import FlowWindow, OrderedInbox
from nebula_mq.runtime.loop import LoopWorker

log = get_logger(__name__)

# How long one wait for the next message lasts before the loop looks at the stop flag.
POLL_S = 0.5


class SteppedWorker(LoopWorker[OrderedInbox]):
    """A worker whose step ``s`` is the message of index ``s`` on :attr:`steps_flow`."""

    in_flight: int  # messages the peer may have in flight ahead of the next one to apply
    steps_flow: topology.Flow  # the flow whose messages are the steps

    # ------------------------------------------------------------------ the role protocol

    def produce(self) -> None:
        """Send what may be sent before the next wait (checks ``stop_requested`` itself)."""

    def admit(self, received: Received) -> None:
        """Raise a ``NebulaError`` to dead-letter ``received`` before it is ordered."""

    def handle_other(self, inbox: OrderedInbox, received: Received) -> bool:
        """True when ``received`` is not a step and was dealt with here (settled or rejected)."""
        return False

    @abstractmethod
    def apply(self, received: Received) -> Mapping[str, float]:
        """Apply the step's message (``self.step`` is its index); returns the step's values."""

    @abstractmethod
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays and metadata that resume the role at ``self.step``."""

    @abstractmethod
    def load(self, ck: Checkpoint) -> None:
        """Resume from ``ck`` (``self.step`` is already ``ck.step``)."""

    # ------------------------------------------------------------------ what the runtime does

    def window(self) -> FlowWindow:
        """The peer runs up to ``in_flight`` messages ahead, plus what it may send before our
        checkpoint catches up; up to ``checkpoint_every`` applied messages wait for the next
        checkpoint. Anything further cannot come from an honest peer."""
        return FlowWindow(ahead=self.in_flight + self.checkpoint_every, unacked=self.checkpoint_every)

    def restore(self) -> None:
        ck = self.store.latest()
        if ck is None:
            return
        self.step = ck.step
        self.load(ck)
        log.info("resumed", step=self.step)

    def checkpoint(self) -> None:
        arrays, meta = self.state()
        self.commit(arrays, meta)
        self.write_history()

    def open_inbox(self) -> OrderedInbox:
        return OrderedInbox(self, self.steps_flow, self.step, self.window())

    def advance(self, inbox: OrderedInbox) -> bool:
        """Send what may be sent, wait for the next message, apply every step it makes ready."""
        self.produce()
        if self.stop_requested.is_set():
            return False
        received = inbox.next(timeout=POLL_S)
        if received is None or self.handle_other(inbox, received):
            return True
        for ready in inbox.take(received, admit=self.admit):
            self.finish_step(inbox, ready, self.apply(ready))
        return True

    def finish_step(self, inbox: OrderedInbox, received: Received, values: Mapping[str, float]) -> None:
        """Count the step, remember the message (acked with the next checkpoint), record the
        values, and checkpoint on schedule and at the last step."""
        self.step += 1
        inbox.applied(received)
        self.record_step(values)
        if self.step % self.checkpoint_every == 0 or self.step == self.total:
            self.checkpoint()
