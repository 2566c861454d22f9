"""One flow's messages, each applied once and strictly in order: the rules in one place.

A role asks an :class:`OrderedInbox` for the messages whose turn has come and says
when it has applied one; the inbox decides everything else:

* **trust** (:class:`~nebula_mq.runtime.channel.Inbox`): checksum, signature,
  schema, codec, NaN;
* **progress, order and dedupe**, with one counter: the index of the next message
  to apply (:class:`InOrderBuffer`; the worker's step restores it). Early arrivals
  wait for their turn; anything below the counter, or a second copy of one that
  waits, is a repeat, acked with the next checkpoint and never handed out again;
  an index the peer could not have sent yet is dead-lettered;
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nebula_mq import topology
from nebula_mq.errors import NebulaError
from nebula_mq.runtime.channel import Inbox, Received
from nebula_mq.runtime.inbox_group import InboxGroup
from nebula_mq.runtime.ordering import InOrderBuffer

if TYPE_CHECKING:
    from nebula_mq.runtime.worker import Worker


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


class OrderedStreams:
    """Ordered streams read from one or more flows: stream ``k`` is applied in index order
    from ``first``, on its own counter (the ELECTRA root: one stream per generator, whether
    the generators share a flow or each has its own; a striped flow: one stream over its
    stripes, ``topology.stripe_flows``). See the module docstring."""

    def __init__(self, worker: Worker, flows: Sequence[topology.Flow], streams: int, first: int,
                 window: FlowWindow, held: int | None = None) -> None:
        """``held``: deliveries held per flow (default ``window.held``: one stream a flow)."""
        self.worker = worker
        reserve = window.held if held is None else held
        self.inbox = InboxGroup([Inbox(worker, f, None, held=reserve) for f in flows])
        self.orders: list[InOrderBuffer[Received]] = [InOrderBuffer(first, window=window.window)
                                                       for _ in range(streams)]

    def next(self, timeout: float) -> Received | None:
        """The next trusted, new delivery, not yet ordered (for a role that handles some
        messages outside the ordered stream); the wait is reported to the worker's hooks."""
        t0 = time.perf_counter()
        received = self.inbox.get(timeout)
        self.worker.hooks.on_wait(time.perf_counter() - t0)
        return received

    def take_from(self, stream: int, received: Received,
                  admit: Callable[[Received], None] | None = None) -> list[Received]:
        """Order one delivery of ``stream``; returns what became ready, in order. A repeat is
        acked with the next checkpoint and dropped; an impossible index is dead-lettered, and
        so is a message ``admit`` refuses (by raising a :class:`NebulaError`)."""
        order = self.orders[stream]
        if order.is_duplicate(received.micro_batch):
            self.inbox.discard_duplicate(received)
            return []
        try:
            if admit is not None:
                admit(received)
            order.push(received.micro_batch, received)
        except NebulaError as exc:  # refused by admit, or out of window
            self.inbox.reject(received, exc)
            return []
        return [r.item for r in order.pop_ready()]

    def settle_unordered(self, received: Received) -> None:
        """Ack now a message outside the ordered stream whose effect is already durable
        and idempotent (an evaluation batch written to disk): nothing to checkpoint."""
        received.delivery.ack()

    def reject(self, received: Received, exc: NebulaError) -> None:
        """Condemn a message the role finds unacceptable (dead-lettered with its reason)."""
        self.inbox.reject(received, exc)

    def applied(self, received: Received) -> None:
        """The role applied ``received``: acked with the next checkpoint."""
        self.inbox.applied(received)

    def close(self) -> None:
        self.inbox.close()


class OrderedInbox(OrderedStreams):
    """The messages of one flow, every stripe of it, in index order from ``first``; see the
    module docstring."""

    def __init__(self, worker: Worker, flow: topology.Flow, first: int, window: FlowWindow) -> None:
        """``first``: the index of the next message to apply (what the last checkpoint holds)."""
        super().__init__(worker, topology.stripe_flows(flow), 1, first, window)

    def take(self, received: Received, admit: Callable[[Received], None] | None = None) -> list[Received]:
        """Order one delivery from :meth:`next`; returns what became ready (see :meth:`take_from`)."""
        return self.take_from(0, received, admit)
