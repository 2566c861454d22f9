"""The RabbitMQ transport: a worker's connections to its local broker.

Queue-level replay. A consumer acks a delivery only after the application has
durably applied its effect (written the checkpoint that contains it, with the
stream's counter past the message's index). Anything not durably applied is
therefore still unacked when a WAN link drops, a consumer crashes (even
``kill -9``) or a broker restarts, and the broker delivers it again: the
queues *are* the replay log, and no application-level resend exists. Repeats
(redeliveries, publish retries after a lost confirm, federation link resets,
which arrive with ``redelivered = False``) are discarded by that counter.

Layout (see ``nebula_mq.topology``): the producer side of a flow declares the
bounded copy of its queue on the sending cluster, the consumer side of a
cross-cluster flow declares the uncapped, federated copy on the receiving
cluster (the federation policy itself is provisioned by the stack). Messages
are published to the local broker only.

Publish path. Publishers, dead-lettering and replies go through the direct exchange of the queue
they publish into (``topology.exchange_for_queue``: a provisioned job's roles may write to their
own flows' exchanges only, since RabbitMQ checks publish rights on the exchange), or on a plain
broker without provisioning (vhost "/", development, the transport's own tests) through the
default exchange: ``routing.Routes`` tells the two apart. Workers never declare exchanges or
bindings: they have no configure right on them, the provisioning admin creates both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pika
import pika.exceptions as px
from pika.adapters.blocking_connection import BlockingChannel

from nebula_mq import topology
from nebula_mq.errors import ConnectionLost
from nebula_mq.settings import BrokerSettings, TransportSettings

from . import base, declare
from .connection import PIKA_ERRORS, close_quietly, open_connection, short_connection, translate
from .identity import connection_user
from .management import QueueSizes
from .consumer import RabbitConsumer
from .probe import QueueProbe
from .publisher import RabbitPublisher
from .routing import Routes

T = TypeVar("T")


def ready_messages(channel: BlockingChannel, queue: str) -> int | None:
    """Ready messages in ``queue`` by a passive declare; None when it does not exist (the broker
    then closes ``channel``, the connection stays)."""
    try:
        return int(channel.queue_declare(queue, passive=True).method.message_count)
    except px.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return None
        raise


class RabbitTransport(base.Transport):
    def __init__(
        self, broker: BrokerSettings, settings: TransportSettings, job_id: str, cluster: str
    ) -> None:
        super().__init__(job_id, cluster)
        topology.vhost(job_id)  # validates the job id early (ValueError on a bad slug)
        self.broker = broker
        self.settings = settings
        self._lock = threading.Lock()
        self._children: list[RabbitPublisher | RabbitConsumer] = []
        self._dead_letters: RabbitPublisher | None = None
        self._routes = Routes()  # queue -> exchange, learned once per queue for all children
        self._serial = 0
        self._sizes = QueueSizes(self.broker)

    def _name(self, role: str) -> str:
        with self._lock:
            self._serial += 1
            return f"{self.job_id}/{self.cluster}/{role}-{self._serial}"

    def _adopt(self, child: Any) -> Any:
        with self._lock:
            self._children.append(child)
        return child

    def open(self) -> None:
        self._with_channel("open", lambda channel: None)

    def close(self) -> None:
        with self._lock:
            children, self._children = self._children, []
            self._dead_letters = None
        for child in children:
            child.close()

    def publisher(self) -> RabbitPublisher:
        return self._adopt(RabbitPublisher(self.broker, self.settings, self._name("pub"), self._routes, self.alarm,
                                           self.wait_checks))

    def consume(self, queue: str, prefetch: int | None = None) -> RabbitConsumer:
        return self._adopt(
            RabbitConsumer(
                self.broker, queue, prefetch or self.settings.prefetch,
                self.dead_letter_queue, self._name("sub"), self._routes,
            )
        )

    # ------------------------------------------------------------------ declaring

    def declare_queue(self, flow: topology.Flow, side: base.Side) -> str:
        name = self.queue_for(flow)
        if flow.crosses_clusters:
            # Capped by policy on the sending side, never downstream (declare.py).
            arguments = declare.federated_copy_arguments()
        else:
            arguments = declare.bounded_queue_arguments(self.settings.max_queue_bytes)
        self._declare(name, arguments)
        return name

    def declare_dead_letter_queue(self) -> str:
        self._declare(self.dead_letter_queue, declare.dead_letter_arguments())
        return self.dead_letter_queue

    def _declare(self, name: str, arguments: dict[str, Any]) -> None:
        self._with_channel(
            f"declare queue {name!r}",
            lambda ch: ch.queue_declare(name, durable=True, arguments=arguments),
        )

    def queue_depth(self, queue: str) -> int | None:
        """On a connection of its own, for occasional checks; sampling uses ``queue_probe``."""
        return self._with_channel(f"inspect queue {queue!r}", lambda channel: ready_messages(channel, queue))

    def queue_bytes(self, queue: str) -> int | None:
        return self._sizes.ready_bytes(queue)

    def queue_probe(self) -> RabbitQueueProbe:
        """One long-lived connection for a sampling thread, instead of ``queue_depth``'s
        connection per call (opened by the probe's first call, on that thread)."""
        return RabbitQueueProbe(self.broker, self._name("probe"))

    def delete_queue(self, queue: str) -> None:
        self._with_channel(f"delete queue {queue!r}", lambda ch: ch.queue_delete(queue))

    def _with_channel(self, what: str, fn: Callable[[BlockingChannel], T]) -> T:
        """A short-lived connection for rare control operations (declares, status)."""
        with short_connection(self.broker, self._name("control"), what) as conn:
            return fn(conn.channel())

    # ------------------------------------------------------------------ dead letters

    def connection_user(self) -> str:
        """The certificate's CN (EXTERNAL auth), or the plaintext user: each dead letter's ``user_id``."""
        return connection_user(self.broker)

    def _dead_letter_publisher(self) -> RabbitPublisher:
        """One publisher of its own, made on the first dead letter and kept until ``close``."""
        with self._lock:
            publisher = self._dead_letters
        if publisher is None:
            publisher = self._adopt(
                RabbitPublisher(self.broker, self.settings, self._name("dlq"), self._routes, self.alarm,
                                self.wait_checks)
            )
            with self._lock:
                self._dead_letters = publisher
        return publisher


class RabbitQueueProbe(QueueProbe):
    """Passive declares on one long-lived connection, sizes over HTTPS, for the thread that uses it.

    The connection opens on the first call, on the calling thread, and is that thread's until
    ``close`` (pika is not thread-safe): a worker's queue sampler makes every call from its own
    thread and closes the probe there. Nobody services the connection between two samples, which
    is fine while samples come more often than the broker's heartbeat timeout; a connection that
    died while idle is noticed at the next declare, which is retried once on a new connection.
    Any other failure drops the connection, and the next call opens a new one.

    Sizes in bytes come from the broker's management API (``management.ManagementClient``), one
    HTTPS request per queue, when the broker settings name one.

    The same connection carries the worker's status messages to the job's status exchange
    (``topology.status_exchange``), unconfirmed: the next sample sends a newer one.
    """

    def __init__(self, broker: BrokerSettings, name: str) -> None:
        """``name`` is the connection's name as the broker lists it."""
        self.broker = broker
        self.name = name
        self._conn: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._sizes = QueueSizes(self.broker)

    def queue_depth(self, queue: str) -> int | None:
        what = f"inspect queue {queue!r}"
        reused = self._conn is not None and self._conn.is_open
        try:
            return ready_messages(self._open_channel(), queue)
        except PIKA_ERRORS as exc:
            self.close()
            err = translate(exc, what)
            if not (reused and isinstance(err, ConnectionLost)):
                raise err from None
        try:  # the connection died while idle: once more, on a new one
            return ready_messages(self._open_channel(), queue)
        except PIKA_ERRORS as exc:
            self.close()
            raise translate(exc, what) from None

    def queue_bytes(self, queue: str) -> int | None:
        return self._sizes.ready_bytes(queue)

    def publish_status(self, exchange: str, key: str, body: bytes) -> None:
        try:
            self._open_channel().basic_publish(
                exchange, key, body, pika.BasicProperties(content_type="application/json", delivery_mode=1))
        except PIKA_ERRORS as exc:
            self.close()
            raise translate(exc, f"publish status to {exchange!r}") from None

    def close(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        close_quietly(conn)

    def _open_channel(self) -> BlockingChannel:
        """The channel, opened again after the broker closed it (a passive declare's 404)."""
        if self._channel is not None and self._channel.is_open:
            return self._channel
        if self._conn is None or not self._conn.is_open:
            self.close()
            self._conn = open_connection(self.broker, self.name)  # raises TransportError
        self._channel = self._conn.channel()
        return self._channel
