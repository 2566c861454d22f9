"""Queue probes: how a worker's queue sampler reads the depth of queues on its local broker.

A probe belongs to one thread, the one that sampled with it first, until that thread closes
it. For RabbitMQ that is pika's rule (a connection is not thread-safe): the probe holds one
long-lived connection for every passive declare (``rabbit.RabbitQueueProbe``). The
in-process probe (:class:`ReadThroughProbe`) needs no connection but keeps the same rule,
so unit tests catch a sampler that would break it. A probe is :class:`Closeable`, as are the
transport's publishers, consumers and the transport itself.
"""

from __future__ import annotations

import abc
import threading
from typing import TYPE_CHECKING, Self

from nebula_mq.errors import TransportError

if TYPE_CHECKING:
    from .base import Transport


class Closeable(abc.ABC):
    """Holds a connection, a subscription or a channel until ``close``; a ``with`` block closes it
    (publishers, consumers, transports and queue probes)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what this holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class QueueProbe(Closeable):
    """Reads queues of the local broker for one thread; ``close`` releases what it holds."""

    @abc.abstractmethod
    def queue_depth(self, queue: str) -> int | None:
        """Ready messages in ``queue``; None when it does not exist."""

    def queue_bytes(self, queue: str) -> int | None:
        """Bytes of the ready messages in ``queue``; None when the broker cannot say (no
        management API, no statistics yet) or the queue does not exist."""
        return None

    @abc.abstractmethod
    def publish_status(self, exchange: str, key: str, body: bytes) -> None:
        """Publish a worker's status message to ``exchange`` (fire and forget: the next sample
        sends a newer one); raises ``TransportError`` when the broker refuses it."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the probe's connection, if any (from the thread that used it)."""


class ReadThroughProbe(QueueProbe):
    """Answers with the transport's own ``queue_depth`` and ``queue_bytes``: for transports whose
    reads are in-process (``memory.MemoryTransport``). A call from a thread other than the first
    caller's, or after ``close``, raises ``TransportError``, as sharing a pika connection would
    be an error."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.owner: threading.Thread | None = None  # the thread of the first call
        self.closed = False
        self.published: list[tuple[str, str, bytes]] = []  # status messages: no exchanges in memory

    def _check(self) -> None:
        if self.closed:
            raise TransportError("queue probe is closed")
        current = threading.current_thread()
        if self.owner is None:
            self.owner = current
        elif self.owner is not current:
            raise TransportError(f"queue probe of thread {self.owner.name!r} used from {current.name!r}")

    def queue_depth(self, queue: str) -> int | None:
        self._check()
        return self.transport.queue_depth(queue)

    def queue_bytes(self, queue: str) -> int | None:
        self._check()
        return self.transport.queue_bytes(queue)

    def publish_status(self, exchange: str, key: str, body: bytes) -> None:
        self._check()
        self.published.append((exchange, key, body))

    def close(self) -> None:
        self.closed = True
