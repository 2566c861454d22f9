"""A role's messages, each applied once and strictly in order: the one inbox, its rules in one place.

The driver asks an :class:`OrderedInbox` for the messages whose turn has come and says
when it has applied one; the inbox decides everything else:

* **trust** (:class:`~nebula_mq.runtime.channel.Inbox`, one per queue it reads):
  checksum, signature, schema, codec, NaN;
* **progress, order and dedupe**, with one counter per stream: the index of the next
  message to apply (:class:`InOrderBuffer`; the worker's step restores it). Early
  arrivals wait for their turn; anything below the counter, or a second copy of one
  that waits, is a repeat, acked with the next checkpoint and never handed out again;
  an index the peer could not have sent yet is dead-lettered. The broker may redeliver
  (after a crash or a WAN drop), federation may duplicate (ack-mode on-confirm), and a
  redelivery may overtake newer messages: the counter turns all of it into one sequence;
* **flow control**: the broker's prefetch covers what the role holds on purpose,
  or the broker would stop delivering while the role waits for the very message
  that lets it checkpoint (a deadlock);
* **acks**: only after the checkpoint that holds the effect (``Worker.commit``).

The window and the prefetch reserve come from one formula, :class:`FlowWindow`:
a peer runs at most ``ahead`` messages ahead of the next one to apply, and up to
``unacked`` applied messages wait for the next checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from nebula_mq import topology
from nebula_mq.errors import NebulaError, OutOfWindow, ReplayedMessage
from nebula_mq.runtime.channel import Inbox, Received

if TYPE_CHECKING:
    from nebula_mq.runtime.worker import Worker

T = TypeVar("T")

# How long one queue is waited on before the next is looked at, when all are empty.
POLL_S = 0.01


@dataclass(frozen=True)
class FlowWindow:
    """How far a flow's messages may run ahead of the one the role needs next.

    ``ahead``: messages an honest peer may have sent beyond the next one to apply
    (its in-flight window plus what it may send before our checkpoint catches up);
    ``unacked``: applied messages still waiting for our next checkpoint.
    """

    ahead: int
    unacked: int

    @property
    def window(self) -> int:
        """Indices from the next one on that are accepted; beyond them, dead letters."""
        return self.ahead

    @property
    def held(self) -> int:
        """Deliveries the role keeps unacked on purpose: the prefetch must exceed them."""
        return self.ahead + self.unacked


@dataclass(frozen=True)
class Ready(Generic[T]):
    index: int
    item: T


class InOrderBuffer(Generic[T]):
    """One stream's counter: releases items strictly in index order, starting at ``next_index``."""

    def __init__(self, next_index: int = 0, window: int = 64) -> None:
        if window < 1:
            raise ValueError("window >= 1")
        self.next_index = next_index
        self.window = window
        self._held: dict[int, T] = {}

    def push(self, index: int, item: T) -> None:
        """Accept an arrival. Raises for indices already applied or outside the window.

        A second copy of an index that is held but not yet released is ignored:
        the first copy wins, and both are byte-identical by construction.
        """
        if index < self.next_index:
            raise ReplayedMessage(f"index {index} already applied (next is {self.next_index})")
        if index >= self.next_index + self.window:
            raise OutOfWindow(
                f"index {index} is beyond the window [{self.next_index}, "
                f"{self.next_index + self.window})"
            )
        self._held.setdefault(index, item)

    def is_duplicate(self, index: int) -> bool:
        return index < self.next_index or index in self._held

    def pop_ready(self) -> Iterator[Ready[T]]:
        """Yield every item whose turn has come; ``next_index`` advances as they go."""
        while self.next_index in self._held:
            item = self._held.pop(self.next_index)
            index = self.next_index
            self.next_index += 1
            yield Ready(index, item)

    def __len__(self) -> int:
        return len(self._held)


class OrderedInbox:
    """The queues a role reads (every stripe of every flow), as ordered streams: stream ``k`` is
    applied in index order from ``first`` on its own counter (a split side: one stream per peer
    rank; the ELECTRA root: one per generator). See the module docstring."""

    def __init__(self, worker: Worker, flows: Sequence[topology.Flow], streams: int, first: int,
                 window: FlowWindow, held: int | None = None) -> None:
        """``held``: deliveries held per queue (default ``window.held``: one stream)."""
        if not flows:
            raise ValueError("at least one flow")
        self.worker = worker
        reserve = window.held if held is None else held
        self.inboxes = [Inbox(worker, f, None, held=reserve) for f in flows]
        self._by_flow = {i.flow.name: i for i in self.inboxes}
        self._next = 0  # round robin over the queues, so no stream starves another
        self.orders: list[InOrderBuffer[Received]] = [InOrderBuffer(first, window=window.window)
                                                       for _ in range(streams)]

    def next(self, timeout: float) -> Received | None:
        """The next trusted, new delivery of any queue, not yet ordered (for a role that handles
        some messages outside the ordered streams); the wait is reported to the worker's hooks."""
        t0 = time.perf_counter()
        received = self._get(timeout)
        self.worker.hooks.on_wait(time.perf_counter() - t0)
        return received

    def _get(self, timeout: float) -> Received | None:
        if len(self.inboxes) == 1:
            return self.inboxes[0].get(timeout)
        deadline = time.monotonic() + timeout
        wait = 0.0
        while True:
            for _ in self.inboxes:
                inbox = self.inboxes[self._next]
                self._next = (self._next + 1) % len(self.inboxes)
                received = inbox.get(wait)
                if received is not None:
                    return received
            if time.monotonic() >= deadline:
                return None
            wait = min(POLL_S, max(0.0, deadline - time.monotonic()))

    def _of(self, received: Received) -> Inbox:
        return self._by_flow[received.envelope.flow]  # the inbox checked the flow on admission

    def take_from(self, stream: int, received: Received,
                  admit: Callable[[Received], None] | None = None) -> list[Received]:
        """Order one delivery of ``stream``; returns what became ready, in order. A repeat is
        acked with the next checkpoint and dropped; an impossible index is dead-lettered, and
        so is a message ``admit`` refuses (by raising a :class:`NebulaError`)."""
        order = self.orders[stream]
        if order.is_duplicate(received.micro_batch):
            self._of(received).discard_duplicate(received)
            return []
        try:
            if admit is not None:
                admit(received)
            order.push(received.micro_batch, received)
        except NebulaError as exc:  # refused by admit, or out of window
            self.reject(received, exc)
            return []
        return [r.item for r in order.pop_ready()]

    def settle_unordered(self, received: Received) -> None:
        """Ack now a message outside the ordered stream whose effect is already durable
        and idempotent (an evaluation batch written to disk): nothing to checkpoint."""
        received.delivery.ack()

    def reject(self, received: Received, exc: NebulaError) -> None:
        """Condemn a message the role finds unacceptable (dead-lettered with its reason)."""
        self._of(received).reject(received, exc)

    def applied(self, received: Received) -> None:
        """The role applied ``received``: acked with the next checkpoint."""
        self._of(received).applied(received)

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.close()
