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

Publish path. A provisioned job (``nebula_mq.stack.provision``) has a durable
direct exchange per flow on the flow's source cluster and one for the
dead-letter queue on every cluster (``topology.flow_exchange``,
``topology.dead_letter_exchange``), each bound to its queue with the queue
name as routing key; roles may write to the exchanges of their own flows only
(write on ``amq.default`` would reach every queue of the job, since RabbitMQ
checks publish rights on the exchange). Publishers and dead-lettering route
through those exchanges, and replies through the exchange of the ``reply_to``
queue (``topology.exchange_for_queue``). A plain broker without provisioning
(vhost "/", development, the transport's own tests) has no flow exchanges:
there, and only there, the default exchange is used. ``routing.Routes``
tells the two apart with one passive exchange declare per queue, so nothing
needs configuring; security does not depend on that choice (a worker that
picked the default exchange on a provisioned vhost is refused with 403).
Workers never declare exchanges or bindings: they have no configure right on
them, the provisioning admin creates both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pika.exceptions as px
from pika.adapters.blocking_connection import BlockingChannel

from nebula_mq import topology
from nebula_mq.settings import BrokerSettings, TransportSettings

from . import base, declare
from .connection import close_quietly, open_connection
from .identity import connection_user
from .management import QueueSizes
from .consumer import RabbitConsumer
from .pika_errors import PIKA_ERRORS, translate
from .publisher import RabbitPublisher
from .rabbit_probe import RabbitQueueProbe
from .routing import Routes

T = TypeVar("T")


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

        def passive(channel: BlockingChannel) -> int | None:
            try:
                return int(channel.queue_declare(queue, passive=True).method.message_count)
            except px.ChannelClosedByBroker as exc:
                if exc.reply_code == 404:
                    return None
                raise

        return self._with_channel(f"inspect queue {queue!r}", passive)

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
        conn = open_connection(self.broker, self._name("control"))
        try:
            return fn(conn.channel())
        except PIKA_ERRORS as exc:
            raise translate(exc, what) from None
        finally:
            close_quietly(conn)

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
