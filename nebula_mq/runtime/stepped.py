"""The runtime's loop (``runtime.loop``) for a role whose steps are the in-order messages of one flow.

:class:`SteppedWorker` also owns the step count and the checkpoint schedule. A role says only:

* what it sends before it waits (:meth:`~SteppedWorker.produce`; a split head
  sends activations up to its window);
* what it does with the next step's messages (:meth:`~SteppedWorker.apply`,
  which returns the step's values): one message per source stream, the
  ``sources`` producers in order (one stream when ``sources`` is empty); which
  messages it refuses (:meth:`~SteppedWorker.admit`) or handles outside the
  ordered streams (:meth:`~SteppedWorker.handle_other`);
* what its state is (:meth:`~SteppedWorker.state`, :meth:`~SteppedWorker.load`).

A data-parallel rank agrees with its group through the worker's
:class:`~nebula_mq.runtime.agreement.Agreement` (given its group when the role joins one):
on the checkpoint to resume from, on when to stop, and that every rank holds a
checkpoint before any rank acks what it covers.

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
from nebula_mq.errors import MalformedMessage
from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.checkpoint import Checkpoint
from nebula_mq.runtime.logs import get_logger
from nebula_mq.runtime.ordered import FlowWindow, OrderedStreams
from nebula_mq.runtime.loop import LoopWorker

log = get_logger(__name__)

# How long one wait for the next message lasts before the loop looks at the stop flag.
POLL_S = 0.5


class SteppedWorker(LoopWorker[OrderedStreams]):
    """A worker whose step ``s`` is the messages of index ``s`` on :attr:`steps_flow`, one
    from each of :attr:`sources`."""

    in_flight: int  # messages the peer may have in flight ahead of the next one to apply
    idle_polls: int = 0  # polls in a row that brought nothing to apply
    steps_flow: topology.Flow  # the flow whose messages are the steps
    # Producer ids whose streams on steps_flow make up a step, in the order apply() gets
    # them; empty: one stream, from whoever publishes on the flow.
    sources: tuple[str, ...] = ()

    # ------------------------------------------------------------------ the role protocol

    def produce(self) -> None:
        """Send what may be sent before the next wait (checks ``stop_requested`` itself)."""

    def admit(self, received: Received) -> None:
        """Raise a ``NebulaError`` to dead-letter ``received`` before it is ordered."""

    def handle_other(self, inbox: OrderedStreams, received: Received) -> bool:
        """True when ``received`` is not a step and was dealt with here (settled or rejected)."""
        return False

    @abstractmethod
    def apply(self, parts: tuple[Received, ...]) -> Mapping[str, float]:
        """Apply the step's messages, one per source (``self.step`` is their index); returns
        the step's values."""

    @abstractmethod
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays and metadata that resume the role at ``self.step``."""

    @abstractmethod
    def load(self, ck: Checkpoint) -> None:
        """Resume from ``ck`` (``self.step`` is already ``ck.step``)."""

    # ------------------------------------------------------------------ a group's agreements

    def stopping(self) -> bool:
        """Whether to stop between steps now (a group stops where its ranks agreed to)."""
        return self.agreement.stopping(self.idle_polls)

    def needs_final_checkpoint(self) -> bool:
        return self.agreement.may_checkpoint() and super().needs_final_checkpoint()

    # ------------------------------------------------------------------ what the runtime does

    def keep_going(self) -> bool:
        return (self.step < self.total or self.more_to_do()) and not self.stopping()

    def window(self) -> FlowWindow:
        """The peer runs up to ``in_flight`` messages ahead, plus what it may send before our
        checkpoint catches up; up to ``checkpoint_every`` applied messages wait for the next
        checkpoint. Anything further cannot come from an honest peer."""
        return FlowWindow(ahead=self.in_flight + self.checkpoint_every, unacked=self.checkpoint_every)

    def restore(self) -> None:
        start = self.agreement.start_step(self.store.steps(), self.worker_id)
        if start is None:
            return
        ck = self.store.load(start)
        self.step = ck.step
        self.load(ck)
        log.info("resumed", step=self.step)

    def checkpoint(self) -> None:
        arrays, meta = self.state()
        self.commit(arrays, meta)
        self.write_history()

    def open_inbox(self) -> OrderedStreams:
        streams = max(1, len(self.sources))
        window = self.window()
        self.waiting: list[list[Received]] = [[] for _ in range(streams)]
        self.idle_polls = 0
        return OrderedStreams(self, topology.stripe_flows(self.steps_flow), streams, self.step, window,
                              held=window.held * streams)

    def stream_of(self, received: Received) -> int:
        """Which source stream ``received`` belongs to; a stranger is malformed."""
        if not self.sources:
            return 0
        try:
            return self.sources.index(received.envelope.producer)
        except ValueError:
            raise MalformedMessage(f"producer {received.envelope.producer!r} is not one of this step's "
                                   f"sources {list(self.sources)}") from None

    def advance(self, inbox: OrderedStreams) -> bool:
        """Send what may be sent, wait for the next message, apply every step it completes."""
        self.produce()
        if self.stopping():
            return False
        received = inbox.next(timeout=POLL_S)
        if received is None:
            self.idle_polls += 1
            return True
        self.idle_polls = 0
        if self.handle_other(inbox, received):
            return True
        try:
            stream = self.stream_of(received)
        except MalformedMessage as exc:
            inbox.reject(received, exc)
            return True
        self.waiting[stream] += inbox.take_from(stream, received, admit=self.admit)
        while all(self.waiting) and not self.stopping():
            parts = tuple(queue.pop(0) for queue in self.waiting)
            self.finish_step(inbox, parts, self.apply(parts))
            # What the schedule sends after this step goes out before the next step is applied,
            # however many steps one arrival completes (out-of-order arrivals across stripes, a
            # replay after a restart): what a role sends depends on its step, never on timing.
            self.produce()
        return True

    def finish_step(self, inbox: OrderedStreams, parts: tuple[Received, ...], values: Mapping[str, float]) -> None:
        """Count the step, remember its messages (acked with the next checkpoint), record the
        values, and checkpoint on schedule and at the last step."""
        self.step += 1
        for received in parts:
            inbox.applied(received)
        self.record_step(values)
        if self.step % self.checkpoint_every == 0 or self.step == self.total:
            self.checkpoint()
