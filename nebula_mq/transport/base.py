"""The transport's extension point: bytes in, bytes out, acked by hand.

A transport moves already-encoded envelopes (opaque bytes) between the workers
of a job. It knows flows and queue names (``nebula_mq.topology``) but nothing
about envelopes, codecs or tensors. Two implementations share these ABCs:
``rabbit.RabbitTransport`` (the real one, RabbitMQ through pika) and
``memory.MemoryTransport`` (in-process, for unit tests of worker logic).

Semantics every implementation honours:

* ``Publisher.publish`` returns only once the broker has taken responsibility
  for the message (publisher confirm). A full bounded queue or a missing route
  makes it wait and retry until ``TransportSettings.publish_patience_s``, then
  it raises ``BackpressureTimeout``. Publishes are at-least-once: a retry after
  a lost confirm can duplicate a message, under the same ``message_id``.
* Deliveries are acked by hand. Anything not acked when a consumer goes away
  (close, crash, connection loss) is delivered again, marked ``redelivered``.
  Consumers discard repeats by identity (the runtime's ordered inbox, by each
  stream's counter of ``seq``); federation repeats arrive with ``redelivered = False``.
* ``Delivery.dead_letter`` moves a condemned message to the cluster's
  dead-letter queue (with the reason in headers) and only then acks it. A
  dead letter carries the AMQP ``user_id`` of the connection that condemned it
  (``Transport.connection_user``; the broker refuses any other), so a message
  in the dead-letter queue without one was not put there by ``dead_letter``.
"""

from __future__ import annotations

import abc
import concurrent.futures
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self, TypedDict, Unpack

import structlog

from nebula_mq import topology
from nebula_mq.errors import TransportError

from .alarm import BrokerAlarm, WaitChecks
from .probe import Closeable, QueueProbe, ReadThroughProbe

log = structlog.get_logger(__name__)

Side = Literal["producer", "consumer"]

# Headers a dead-lettered message carries, next to its original headers.
REASON_HEADER = "x-nebula-reason"
DETAIL_HEADER = "x-nebula-detail"
ORIGINAL_QUEUE_HEADER = "x-nebula-original-queue"
MESSAGE_ID_HEADER = "x-nebula-message-id"


class Delivery(abc.ABC):
    """One received message. ``ack`` and ``dead_letter`` are safe from any thread."""

    body: bytes | memoryview
    message_id: str
    headers: Mapping[str, Any]
    # True when the broker delivered it before (consumer loss); federation
    # duplicates are NOT marked, so dedupe on message_id, not on this.
    redelivered: bool
    correlation_id: str | None
    # Queue name of the requester's reply flow (request/reply only).
    reply_to: str | None
    # Broker-side tag; only meaningful on the connection that delivered it.
    delivery_tag: int
    # Queue this delivery came from.
    queue: str

    @abc.abstractmethod
    def ack(self) -> bool:
        """Settle the message: the effect is durably applied, never deliver it again.

        Returns False when the delivering connection is gone: the broker will
        deliver the message again and the consumer's dedupe discards it.
        Raises ``TransportError`` on a second settle of the same delivery.
        """

    @abc.abstractmethod
    def dead_letter(self, reason: str, detail: str = "") -> None:
        """Republish to the dead-letter queue (confirmed), then ack. Never loses it."""


class Consumer(Closeable):
    """A subscription to one queue with manual acks and bounded prefetch."""

    queue: str

    @abc.abstractmethod
    def get(self, timeout: float | None = None) -> Delivery | None:
        """Next delivery, or None after ``timeout`` seconds (None waits forever)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop consuming; unacked deliveries go back to the queue."""


class PublishHandle:
    """A submitted message: ``wait`` returns once the broker holds it, or raises why it never will."""

    def __init__(self, future: concurrent.futures.Future[None], message_id: str) -> None:
        self._future = future
        self.message_id = message_id

    @classmethod
    def confirmed(cls, message_id: str) -> PublishHandle:
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.set_result(None)
        return cls(future, message_id)

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> None:
        try:
            self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TransportError(f"publish of {self.message_id!r}: no confirm within {timeout} s") from None


@dataclass(frozen=True)
class Outgoing:
    """A message handed to a publisher: the queue it goes into and what it carries."""

    queue: str
    body: bytes | memoryview
    message_id: str
    headers: Mapping[str, Any] | None = None
    correlation_id: str | None = None
    # Queue name of the requester's reply flow (request/reply only).
    reply_to: str | None = None
    # The connection's user name, on dead letters only (``identity`` module).
    user_id: str | None = None


class PublishOptions(TypedDict, total=False):
    """What a publish may add to its message beside its queue, body and id (:class:`Outgoing`)."""

    headers: Mapping[str, Any] | None
    correlation_id: str | None
    reply_to: str | None


class Publisher(Closeable):
    """Confirmed, persistent publishes to a queue of the local broker; each implementation
    submits an :class:`Outgoing` (``_submit``)."""

    def publish_async(self, queue: str, body: bytes | memoryview, message_id: str,
                      **options: Unpack[PublishOptions]) -> PublishHandle:
        """Submit a message; its handle's ``wait`` returns once the broker holds it (a publisher
        with a window of confirms returns at once, one without it once the broker confirmed)."""
        return self._submit(Outgoing(queue, body, message_id, **options))

    def publish(self, queue: str, body: bytes | memoryview, message_id: str,
                **options: Unpack[PublishOptions]) -> None:
        """Block until the broker confirmed the message (see module docstring)."""
        self.publish_async(queue, body, message_id, **options).wait()

    @abc.abstractmethod
    def _submit(self, message: Outgoing) -> PublishHandle:
        """Submit ``message`` as ``publish_async`` says."""

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the broker holds every message submitted so far (raise the first failure)."""


class Transport(Closeable):
    """A worker's view of its *local* broker, for one job on one cluster."""

    def __init__(self, job_id: str, cluster: str) -> None:
        self.job_id = job_id
        # The cluster this worker runs on; decides which copy of a flow it declares.
        self.cluster = cluster
        # The local broker's resource alarms, as this transport's publishers meet them.
        self.alarm = BrokerAlarm(cluster)
        # What its publishers' waits look at (``alarm.WaitChecks``): the alarm's stop, and more.
        self.wait_checks = WaitChecks(self.alarm.check_stop)

    def queue_for(self, flow: topology.Flow | str) -> str:
        """Queue name of a flow (same name on both clusters)."""
        return topology.queue_name(self.job_id, flow if isinstance(flow, str) else flow.name)

    @property
    def dead_letter_queue(self) -> str:
        return topology.dead_letter_queue(self.job_id)

    def check_side(self, flow: topology.Flow, side: Side) -> None:
        """A producer declares on the flow's source cluster, a consumer on its destination."""
        expected = flow.src_cluster if side == "producer" else flow.dst_cluster
        if side not in ("producer", "consumer"):
            raise TransportError(f"side must be 'producer' or 'consumer', got {side!r}")
        if expected != self.cluster:
            raise TransportError(
                f"flow {flow.name!r}: the {side} side lives on cluster {expected!r}, "
                f"this transport is on {self.cluster!r}"
            )

    @abc.abstractmethod
    def open(self) -> None:
        """Check the broker is reachable with these credentials (fails fast)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close every publisher and consumer this transport made."""

    @abc.abstractmethod
    def publisher(self) -> Publisher: ...

    @abc.abstractmethod
    def consume(self, queue: str, prefetch: int | None = None) -> Consumer: ...

    def declare_flow(self, flow: topology.Flow, side: Side) -> str:
        """Declare this cluster's copy of a flow's queue, every stripe of it
        (``topology.stripe_flows``); returns the queue name of stripe 0, the flow's own."""
        self.check_side(flow, side)
        return [self.declare_queue(stripe, side) for stripe in topology.stripe_flows(flow)][0]

    @abc.abstractmethod
    def declare_queue(self, flow: topology.Flow, side: Side) -> str:
        """Declare this cluster's copy of one physical flow's queue; returns the queue name."""

    @abc.abstractmethod
    def declare_dead_letter_queue(self) -> str: ...

    def dead_letter(
        self,
        body: bytes | memoryview,
        message_id: str,
        reason: str,
        detail: str = "",
        original_queue: str = "",
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        """Put a message straight into the dead-letter queue (confirmed), stamped with this
        transport's ``connection_user`` as its ``user_id``."""
        headers = dead_letter_headers(headers, message_id, reason, detail, original_queue)
        outgoing = Outgoing(self.dead_letter_queue, body, message_id, headers, user_id=self.connection_user())
        self._dead_letter_publisher()._submit(outgoing).wait()
        log.error("message dead-lettered", queue=original_queue, message_id=message_id,
                  reason=reason, detail=detail)

    def connection_user(self) -> str | None:
        """The user name the broker knows this transport's connections by (None: no broker
        checks one, as in memory)."""
        return None

    @abc.abstractmethod
    def _dead_letter_publisher(self) -> Publisher:
        """The publisher ``dead_letter`` publishes with."""

    @abc.abstractmethod
    def queue_depth(self, queue: str) -> int | None:
        """Ready messages in a queue of the local broker; None when it does not exist."""

    def queue_bytes(self, queue: str) -> int | None:
        """Bytes of the ready messages in a queue of the local broker; None when the broker
        cannot say (no management API) or the queue does not exist."""
        return None

    def queue_probe(self) -> QueueProbe:
        """A probe for a thread that samples queue depths (``probe`` module). This one reads
        through ``queue_depth`` and ``queue_bytes``, for in-process transports; a transport that
        talks to a broker gives a probe that owns its own connection."""
        return ReadThroughProbe(self)

    @abc.abstractmethod
    def delete_queue(self, queue: str) -> None: ...

    def __enter__(self) -> Self:
        self.open()
        return self


def dead_letter_headers(
    headers: Mapping[str, Any] | None, message_id: str, reason: str, detail: str, queue: str
) -> dict[str, Any]:
    """Original headers plus the ``x-nebula-*`` ones that explain the condemnation."""
    out = dict(headers or {})
    out[REASON_HEADER] = reason
    out[DETAIL_HEADER] = detail[:1024]  # bounded: details are for humans, not payloads
    out[ORIGINAL_QUEUE_HEADER] = queue
    out[MESSAGE_ID_HEADER] = message_id
    return out
