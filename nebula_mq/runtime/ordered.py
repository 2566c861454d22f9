"""A role's steps, each message applied once and strictly in order: the one inbox, its rules in one place.

The driver asks an :class:`OrderedInbox` to wait for the next delivery
(:meth:`OrderedInbox.receive`) and for the next complete step (:meth:`OrderedInbox.next_step`),
applies that step and says so; the inbox decides everything else:

* **trust** (:class:`~nebula_mq.runtime.channel.Inbox`, one per queue it reads):
  checksum, signature, schema, codec, NaN;
* **streams**: one per producer in the role's ``sources`` (one from whoever publishes when
  there are none); a producer that is not a source is a stranger, dead-lettered, and so is a
  message the role's ``admit`` refuses; a message that is no step's (an evaluation batch) goes
  to the role's ``other``;
* **progress, order and dedupe**, with one counter per stream: the index of the next
  message to apply (:class:`InOrderBuffer`; the worker's step restores it). Early
  arrivals wait for their turn; anything below the counter, or a second copy of one
  that waits, is a repeat, acked with the next checkpoint and never handed out again;
  an index the peer could not have sent yet is dead-lettered. The broker may redeliver
  (after a crash or a WAN drop), federation may duplicate (ack-mode on-confirm), and a
  redelivery may overtake newer messages: the counter turns all of it into one sequence;
* **steps**: ``per_step`` consecutive messages of every stream make a step, streams in
  ``sources`` order; a role that decides its steps' members (``members``, a quorum) may leave
  streams out: what they hold for that step is acked with the next checkpoint, never
  applied, and what has not come yet is skipped, so it is a repeat when it comes;
* **flow control**: the broker's prefetch covers what the role holds on purpose,
  or the broker would stop delivering while the role waits for the very message
  that lets it checkpoint (a deadlock);
* **acks**: only after the checkpoint that holds the effect (``Worker.commit``);
* **a broker that lost the job** (wiped while stopped): while the role waits with its
  consumers disconnected (for a message, or for a confirm of what it publishes), a
  :class:`~nebula_mq.runtime.lost_broker.BrokerWatch` asks the broker whether it still holds
  the job, and stops the role with one ``BrokerDataLost`` naming the micro-batches each stream
  still needs once it does not; at the opening, a broker that is not the incarnation of the
  worker's checkpoints (wiped, then provisioned again) stops it too.

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
from nebula_mq.errors import MalformedMessage, NebulaError, OutOfWindow, ReplayedMessage
from nebula_mq.runtime.channel import Inbox, Received
from nebula_mq.runtime.lost_broker import BrokerWatch
from nebula_mq.runtime.role import Members, StepInputs

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
    ``unacked``: applied messages still waiting for our next checkpoint;
    ``behind``: messages the peers may send beyond ``ahead`` while the role is left out of
    their steps (a replicas quorum going on without this cluster). They are accepted, but
    not prefetched: each queue is one producer's, in order, so what the role needs next is
    at the queue's head.
    """

    ahead: int
    unacked: int
    behind: int = 0

    @property
    def window(self) -> int:
        """Indices from the next one on that are accepted; beyond them, dead letters."""
        return self.ahead + self.behind

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

    def skip(self, count: int) -> None:
        """Move the counter past ``count`` indices that will never be applied (a step that goes
        on without this stream): their copies, arriving later, are repeats. None of them may be
        held (a held one would stay unacked)."""
        if any(index in self._held for index in range(self.next_index, self.next_index + count)):
            raise ValueError(f"indices {self.next_index}..{self.next_index + count - 1} hold a message: apply it")
        self.next_index += count

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
    """The queues a role reads (every stripe of every flow), as ordered streams, handed out a
    step at a time: stream ``k`` is applied in index order from step ``first_step`` on its own
    counter (a split side: one stream per peer rank; the ELECTRA root: one per generator).
    See the module docstring."""

    def __init__(self, worker: Worker, inputs: StepInputs, first_step: int, window: FlowWindow, *,
                 members: Members | None = None, admit: Callable[[Received], object] | None = None,
                 other: Callable[[OrderedInbox, Received], bool] | None = None) -> None:
        """The role's hooks (``runtime.role.Extras``): ``members``, which streams each step
        takes (default: every stream, once each has its messages); ``admit``, raises a
        :class:`NebulaError` for a message to dead-letter; ``other``, True when a message is not
        a step's and was settled or rejected there (default: every message is a step's)."""
        flows = [stripe for flow in inputs.flows for stripe in topology.stripe_flows(flow)]
        if not flows:
            raise ValueError("at least one flow")
        self.worker = worker
        self.sources, self.per_step = inputs.sources, inputs.per_step
        self.members, self.admit, self.other = members, admit, other
        self.inboxes = [Inbox(worker, f, held=window.held * inputs.streams) for f in flows]
        self._by_flow = {i.flow.name: i for i in self.inboxes}
        self._next = 0  # round robin over the queues, so no stream starves another
        first = first_step * inputs.per_step
        self.orders: list[InOrderBuffer[Received]] = [InOrderBuffer(first, window=window.window)
                                                       for _ in range(inputs.streams)]
        # Each stream's messages whose turn has come, in order, waiting for their step.
        self.waiting: list[list[Received]] = [[] for _ in range(inputs.streams)]
        self.watch = BrokerWatch(worker, [i.consumer for i in self.inboxes])
        # The same watch while this thread waits for the broker's confirms (ledger, outbox).
        self._unwatch = worker.transport.wait_checks.add(lambda: self.watch.check(self.needs))
        try:
            self.watch.opened(self.needs)  # BrokerDataLost for a broker wiped and provisioned again
        except BaseException:
            self.close()
            raise

    def receive(self, timeout: float) -> bool:
        """Wait for the next trusted, new delivery of any queue and order it into its stream
        (unless ``other`` takes it); whether one came."""
        received = self.next(timeout)
        if received is None:
            return False
        if self.other is None or not self.other(self, received):
            self.take(received)
        return True

    def next(self, timeout: float) -> Received | None:
        """The next trusted, new delivery of any queue, not yet ordered (for a role that handles
        some messages outside the ordered streams); the wait is reported to the worker's hooks."""
        t0 = time.perf_counter()
        received = self._get(timeout)
        self.worker.hooks.on_wait(time.perf_counter() - t0)
        if received is None:
            self.watch.check(self.needs)  # raises BrokerDataLost once the broker lost the job
        return received

    def needs(self) -> str:
        """What the role waits for, e.g. ``micro-batches 41.. of flow 'activations' (applied up
        to 40)``; a stream each where the streams differ."""
        flows = ", ".join(repr(name) for name in dict.fromkeys(i.flow.name for i in self.inboxes))
        nexts = [order.next_index for order in self.orders]
        if len(set(nexts)) == 1:
            what = f"micro-batches {nexts[0]}.."
            applied = f"applied up to {nexts[0] - 1}" if nexts[0] > 0 else "none applied"
        else:
            what = "micro-batches " + ", ".join(f"{n}.. (stream {k})" for k, n in enumerate(nexts))
            applied = "each stream applied up to the one before"
        return f"{what} of flow{'s' if ', ' in flows else ''} {flows} ({applied})"

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

    def take(self, received: Received) -> None:
        """Order one delivery into its stream; a stranger's is dead-lettered."""
        try:
            stream = self.stream_of(received)
        except MalformedMessage as exc:
            self.reject(received, exc)
            return
        self.waiting[stream] += self.take_from(stream, received)

    def stream_of(self, received: Received) -> int:
        """Which source stream ``received`` belongs to; a stranger is malformed."""
        if not self.sources:
            return 0
        try:
            return self.sources.index(received.envelope.producer)
        except ValueError:
            raise MalformedMessage(f"producer {received.envelope.producer!r} is not one of this step's "
                                   f"sources {list(self.sources)}") from None

    def take_from(self, stream: int, received: Received) -> list[Received]:
        """Order one delivery of ``stream``; returns what became ready, in order. A repeat is
        acked with the next checkpoint and dropped; an impossible index is dead-lettered, and
        so is a message ``admit`` refuses (by raising a :class:`NebulaError`)."""
        order = self.orders[stream]
        if order.is_duplicate(received.micro_batch):
            self._of(received).discard_duplicate(received)
            return []
        try:
            if self.admit is not None:
                self.admit(received)
            order.push(received.micro_batch, received)
        except NebulaError as exc:  # refused by admit, or out of window
            self.reject(received, exc)
            return []
        return [r.item for r in order.pop_ready()]

    def taken(self) -> tuple[bool, ...] | None:
        """The streams the next step takes (``members``), or None while it waits."""
        if self.members is None:
            return tuple(True for _ in self.waiting) if all(len(q) >= self.per_step for q in self.waiting) else None
        return self.members(tuple(q[0] if len(q) >= self.per_step else None for q in self.waiting))

    def next_step(self) -> tuple[Received, ...] | None:
        """The next complete step's messages (``per_step`` of each stream it takes, in stream
        order), or None while it waits. A step with members left out may be complete with
        nothing new arrived (a quorum's wait that ran out): what a left-out stream holds for it
        is acked with the next checkpoint, never applied; what it has not had yet is skipped."""
        take = self.taken()
        if take is None:
            return None
        parts: list[Received] = []
        for k, queue in enumerate(self.waiting):
            mine = queue[:self.per_step]
            del queue[:self.per_step]
            if take[k]:
                parts += mine
                continue
            self.applied(*mine)
            if len(mine) < self.per_step:
                order = self.orders[k]
                order.skip(self.per_step - len(mine))
                queue += [r.item for r in order.pop_ready()]
        return tuple(parts)

    def settle_unordered(self, received: Received) -> None:
        """Ack now a message outside the ordered stream whose effect is already durable
        and idempotent (an evaluation batch written to disk): nothing to checkpoint."""
        received.delivery.ack()

    def reject(self, received: Received, exc: NebulaError) -> None:
        """Condemn a message the role finds unacceptable (dead-lettered with its reason)."""
        self._of(received).reject(received, exc)

    def applied(self, *done: Received) -> None:
        """The role applied these messages (or its step left them out): acked with the next
        checkpoint."""
        for received in done:
            self._of(received).applied(received)

    def close(self) -> None:
        self._unwatch()
        for inbox in self.inboxes:
            inbox.close()
