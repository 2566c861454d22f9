"""The loop of a role whose steps are the in-order messages of one flow: the runtime owns it.

As dramatiq's worker owns the loop and calls the actor, :class:`SteppedWorker`
owns the loop and calls the role. A role says only:

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
from nebula_mq.runtime.worker import Worker

log = get_logger(__name__)

# How long one wait for the next message lasts before the loop looks at the stop flag.
POLL_S = 0.5


class SteppedWorker(Worker):
    """A worker whose step ``s`` is the message of index ``s`` on :attr:`steps_flow`."""

    total: int  # steps to train
    in_flight: int  # messages the peer may have in flight ahead of the next one to apply
    steps_flow: topology.Flow  # the flow whose messages are the steps

    # ------------------------------------------------------------------ the role protocol

    def open(self) -> None:
        """Declare the queues and open the outboxes (before the checkpoint is restored)."""

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

    def more_to_do(self) -> bool:
        """Keep consuming after the last step (e.g. evaluation batches)."""
        return False

    def unsaved(self) -> bool:
        """Whether anything since the start needs a final checkpoint (beyond applied steps)."""
        return self.step > 0

    def after_training(self) -> None:
        """Called once every step is applied and checkpointed (not after a stop request)."""

    def close(self) -> None:
        """Close the outboxes :meth:`open` opened."""

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

    def run(self) -> int:
        self.transport.declare_dead_letter_queue()
        self.open()
        self.restore()
        inbox = OrderedInbox(self, self.steps_flow, self.step, self.window())
        try:
            while (self.step < self.total or self.more_to_do()) and not self.stop_requested.is_set():
                self.produce()
                if self.stop_requested.is_set():
                    break
                received = inbox.next(timeout=POLL_S)
                if received is None or self.handle_other(inbox, received):
                    continue
                for ready in inbox.take(received, admit=self.admit):
                    self.finish_step(inbox, ready, self.apply(ready))
            # Normal end or a stop request: what was applied is checkpointed and acked.
            if self.unsaved() and not self.has_checkpoint_at_step():
                self.checkpoint()
            if self.step >= self.total and not self.stop_requested.is_set():
                self.after_training()
        finally:
            self.close()
            inbox.close()
        return 0

    def finish_step(self, inbox: OrderedInbox, received: Received, values: Mapping[str, float]) -> None:
        """Count the step, remember the message (acked with the next checkpoint), record the
        values, and checkpoint on schedule and at the last step."""
        self.step += 1
        inbox.applied(received)
        self.record_step(values)
        if self.step % self.checkpoint_every == 0 or self.step == self.total:
            self.checkpoint()
