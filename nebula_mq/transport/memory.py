"""An in-process transport with the broker's semantics, for unit tests of workers.

One ``MemoryBroker`` stands for every cluster of a test. What it honours, as
RabbitMQ does in our topology:

* bounded queues refuse a publish that would pass ``max_queue_bytes`` (counting
  ready messages only, as ``x-max-length-bytes`` does); the publisher waits and
  retries as the RabbitMQ publisher does (``retry.Patience``: the same counters,
  backoff and errors), then ``BackpressureTimeout``;
* a publish to an undeclared queue is unroutable (waited out the same way);
* manual acks, at most ``prefetch`` unacked deliveries per consumer;
* unacked deliveries return to the head of the queue, in order and marked
  ``redelivered``, when their consumer closes (a crash is a close without acks);
* ``dead_letter`` moves the message to the job's dead-letter queue, then acks.

Federation is modelled as a single queue per name: the producer side's cap
applies, the consumer side's (uncapped) declaration only checks it exists.
That matches what the real layout gives a worker: a downstream copy that only
pulls while its consumers have room, so the sender's cap is what pushes back.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from nebula_mq import topology
from nebula_mq.errors import PublishRejected, TransportError, Unroutable
from nebula_mq.settings import TransportSettings

from . import base
from .retry import WAITED_OUT, Patience, PublishStats

log = structlog.get_logger(__name__)


@dataclass
class _Message:
    body: bytes
    message_id: str
    headers: dict[str, Any]
    correlation_id: str | None
    reply_to: str | None
    redelivered: bool = False


@dataclass
class _Queue:
    name: str
    max_bytes: int | None  # None: uncapped
    ready: collections.deque[_Message] = field(default_factory=collections.deque)
    ready_bytes: int = 0


class MemoryBroker:
    """All queues of all clusters; thread-safe; one Condition guards everything."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queues: dict[str, _Queue] = {}
        # (cluster, queue) -> declared arguments; a re-declare must repeat them.
        self.declared: dict[tuple[str, str], tuple[Any, ...]] = {}
        # Set by shutdown(): every waiter wakes and every later call fails, as when
        # a real broker goes away (a test whose worker died must not wait for ever).
        self.down_reason: str | None = None

    def shutdown(self, reason: str) -> None:
        """Take the broker down: waiting consumers and producers raise TransportError."""
        with self.cond:
            self.down_reason = reason
            self.cond.notify_all()

    def check_up(self) -> None:
        """Raise TransportError once the broker is down (callers hold ``cond``)."""
        if self.down_reason is not None:
            raise TransportError(f"in-memory broker is down: {self.down_reason}")

    def declare(self, cluster: str, name: str, max_bytes: int | None) -> None:
        with self.cond:
            args = ("capped", max_bytes) if max_bytes is not None else ("uncapped",)
            known = self.declared.setdefault((cluster, name), args)
            if known != args:
                raise TransportError(
                    f"queue {name!r} on {cluster!r} exists with arguments {known}, not {args}"
                )
            queue = self.queues.setdefault(name, _Queue(name, max_bytes))
            if max_bytes is not None:
                queue.max_bytes = max_bytes

    def put(self, name: str, message: _Message) -> None:
        with self.cond:
            self.check_up()
            queue = self.queues.get(name)
            if queue is None:
                raise Unroutable(f"no queue {name!r}")
            size = len(message.body)
            if queue.max_bytes is not None and queue.ready_bytes + size > queue.max_bytes:
                raise PublishRejected(f"queue {name!r} is full")
            queue.ready.append(message)
            queue.ready_bytes += size
            self.cond.notify_all()

    def requeue_front(self, name: str, messages: list[_Message]) -> None:
        with self.cond:
            queue = self.queues.get(name)
            if queue is None:  # deleted meanwhile: the broker would drop them too
                return
            for message in reversed(messages):
                message.redelivered = True
                queue.ready.appendleft(message)
                queue.ready_bytes += len(message.body)
            self.cond.notify_all()


class MemoryDelivery(base.Delivery):
    def __init__(self, consumer: MemoryConsumer, tag: int, message: _Message) -> None:
        self._consumer = consumer
        self._message = message
        self.body = message.body
        self.message_id = message.message_id
        self.headers = dict(message.headers)
        self.redelivered = message.redelivered
        self.correlation_id = message.correlation_id
        self.reply_to = message.reply_to
        self.delivery_tag = tag
        self.queue = consumer.queue

    def ack(self) -> bool:
        return self._consumer._settle(self.delivery_tag)

    def dead_letter(self, reason: str, detail: str = "") -> None:
        headers = base.dead_letter_headers(
            self.headers, self.message_id, reason, detail, self.queue
        )
        if not self._consumer._is_unacked(self.delivery_tag):
            return  # its consumer is gone: it was requeued and will be condemned again
        self._consumer._broker.put(
            self._consumer._dead_letter_queue,
            _Message(self._message.body, self.message_id, headers, self.correlation_id, None),
        )
        self._consumer._settle(self.delivery_tag)
        log.error("message dead-lettered", queue=self.queue, message_id=self.message_id,
                  reason=reason, detail=detail)


class MemoryConsumer(base.Consumer):
    def __init__(self, broker: MemoryBroker, queue: str, prefetch: int, dead_letter_queue: str):
        self._broker = broker
        self.queue = queue
        self._prefetch = prefetch
        self._dead_letter_queue = dead_letter_queue
        self._tags = itertools.count(1)
        self._unacked: dict[int, _Message] = {}
        self._closed = False
        with broker.cond:
            if queue not in broker.queues:
                raise TransportError(f"cannot consume: no queue {queue!r}")

    def get(self, timeout: float | None = None) -> base.Delivery | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._broker.cond:
            while True:
                if self._closed:
                    raise TransportError(f"consumer of {self.queue!r} is closed")
                self._broker.check_up()
                queue = self._broker.queues.get(self.queue)
                if queue is not None and queue.ready and len(self._unacked) < self._prefetch:
                    message = queue.ready.popleft()
                    queue.ready_bytes -= len(message.body)
                    tag = next(self._tags)
                    self._unacked[tag] = message
                    self._broker.cond.notify_all()
                    return MemoryDelivery(self, tag, message)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._broker.cond.wait(remaining)

    def _is_unacked(self, tag: int) -> bool:
        with self._broker.cond:
            return tag in self._unacked

    def _settle(self, tag: int) -> bool:
        with self._broker.cond:
            if self._closed:
                return False
            if self._unacked.pop(tag, None) is None:
                raise TransportError(f"delivery {tag} on {self.queue!r} already settled")
            self._broker.cond.notify_all()
            return True

    def close(self) -> None:
        with self._broker.cond:
            if self._closed:
                return
            self._closed = True
            pending = [self._unacked[t] for t in sorted(self._unacked)]
            self._unacked.clear()
            self._broker.requeue_front(self.queue, pending)


class MemoryPublisher(base.Publisher):
    def __init__(self, broker: MemoryBroker, settings: TransportSettings) -> None:
        self._broker = broker
        self._settings = settings
        self.stats = PublishStats()

    def _submit(self, outgoing: base.Outgoing) -> base.PublishHandle:
        """Stored (or refused) before it returns: the memory broker confirms at once."""
        message = _Message(bytes(outgoing.body), outgoing.message_id, dict(outgoing.headers or {}),
                           outgoing.correlation_id, outgoing.reply_to)
        patience = Patience(outgoing.queue, outgoing.message_id, self._settings.publish_patience_s, self.stats)
        while True:
            try:
                self._broker.put(outgoing.queue, message)
            except WAITED_OUT as exc:
                wait = patience.next_wait(exc)
                if wait is None:
                    raise patience.gave_up(exc) from None
                time.sleep(wait)
            else:
                patience.published()
                return base.PublishHandle.confirmed(outgoing.message_id)

    def close(self) -> None:
        pass


class MemoryTransport(base.Transport):
    def __init__(
        self, broker: MemoryBroker, settings: TransportSettings, job_id: str, cluster: str
    ) -> None:
        super().__init__(job_id, cluster)
        self.broker = broker
        self.settings = settings
        self._children: list[MemoryConsumer] = []

    def open(self) -> None:
        pass

    def close(self) -> None:
        for child in self._children:
            child.close()
        self._children.clear()

    def publisher(self) -> MemoryPublisher:
        return MemoryPublisher(self.broker, self.settings)

    def consume(self, queue: str, prefetch: int | None = None) -> MemoryConsumer:
        consumer = MemoryConsumer(
            self.broker, queue, prefetch or self.settings.prefetch, self.dead_letter_queue
        )
        self._children.append(consumer)
        return consumer

    def declare_queue(self, flow: topology.Flow, side: base.Side) -> str:
        name = self.queue_for(flow)
        uncapped = side == "consumer" and flow.crosses_clusters
        self.broker.declare(self.cluster, name, None if uncapped else self.settings.max_queue_bytes)
        return name

    def declare_dead_letter_queue(self) -> str:
        self.broker.declare(self.cluster, self.dead_letter_queue, None)
        return self.dead_letter_queue

    def _dead_letter_publisher(self) -> MemoryPublisher:
        return self.publisher()

    def queue_depth(self, queue: str) -> int | None:
        with self.broker.cond:
            known = self.broker.queues.get(queue)
            return None if known is None else len(known.ready)

    def queue_bytes(self, queue: str) -> int | None:
        with self.broker.cond:
            known = self.broker.queues.get(queue)
            return None if known is None else known.ready_bytes

    def delete_queue(self, queue: str) -> None:
        with self.broker.cond:
            self.broker.queues.pop(queue, None)
            for key in [k for k in self.broker.declared if k[1] == queue]:
                del self.broker.declared[key]
