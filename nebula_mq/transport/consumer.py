"""Consuming with manual acks; the connection lives in its own I/O thread.

Deliveries are handed to the application through a thread-safe queue, at most
``prefetch`` unacked at a time. ``ack`` and ``dead_letter`` go back to the I/O
thread through ``IoThread.call``. After a reconnect the consumer re-subscribes;
deliveries of the dead connection are dropped from the hand-off queue (the
broker requeued them and delivers them again, marked redelivered).
"""

from __future__ import annotations

import queue as queue_mod
import threading
import time

import pika
import structlog
from pika.adapters.blocking_connection import BlockingChannel

from nebula_mq.errors import ConnectionLost, TransportError
from nebula_mq.settings import BrokerSettings

from . import base
from .connection import IoThread, OnIoThread
from .identity import connection_user
from .publisher import message_properties
from .routing import Routes

log = structlog.get_logger(__name__)


class RabbitDelivery(base.Delivery):
    def __init__(
        self,
        consumer: RabbitConsumer,
        channel: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        props: pika.BasicProperties,
        body: bytes,
    ) -> None:
        self._consumer = consumer
        self._channel = channel  # the channel that delivered it: tags are per channel
        self._lock = threading.Lock()
        self._settled = False
        self.body = body
        self.message_id = props.message_id or ""
        self.headers = dict(props.headers or {})
        self.redelivered = bool(method.redelivered)
        self.correlation_id = props.correlation_id
        self.reply_to = props.reply_to
        self.delivery_tag = method.delivery_tag
        self.queue = consumer.queue

    def _claim(self) -> None:
        with self._lock:
            if self._settled:
                raise TransportError(f"delivery {self.message_id!r} already settled")
            self._settled = True

    def _unclaim(self) -> None:
        with self._lock:
            self._settled = False

    def _live(self) -> bool:  # I/O thread only
        channel = self._channel
        return channel is self._consumer._channel and channel is not None and bool(channel.is_open)

    def ack(self) -> bool:
        self._claim()

        def do() -> bool:
            if not self._live():
                return False
            self._channel.basic_ack(self.delivery_tag)
            return True

        try:
            return self._consumer._io.call(do)
        except ConnectionLost:
            return False  # requeued by the broker; dedupe discards the repeat

    def dead_letter(self, reason: str, detail: str = "") -> None:
        self._claim()
        consumer = self._consumer
        headers = base.dead_letter_headers(self.headers, self.message_id, reason, detail, self.queue)
        # user_id: the broker checks it is this connection's user, so it proves who condemned it.
        props = message_properties(self.message_id, headers, self.correlation_id, None, consumer.user_id)

        def do() -> bool:
            if not self._live():
                return False
            dl_channel = consumer._dl_channel
            assert dl_channel is not None
            assert consumer._conn is not None
            exchange = consumer._routes.exchange(consumer._conn, consumer.dead_letter_queue)
            dl_channel.basic_publish(exchange, consumer.dead_letter_queue, self.body, props, mandatory=True)
            self._channel.basic_ack(self.delivery_tag)
            return True

        try:
            done = consumer._io.call(do)
        except ConnectionLost:
            done = False
        except TransportError:
            self._unclaim()  # still unacked: nothing lost, the caller sees why
            raise
        log.error(
            "message dead-lettered" if done else "dead-letter deferred: connection lost",
            queue=self.queue, message_id=self.message_id, reason=reason, detail=detail,
        )


class RabbitConsumer(OnIoThread, base.Consumer):
    def __init__(
        self,
        broker: BrokerSettings,
        queue: str,
        prefetch: int,
        dead_letter_queue: str,
        name: str,
        routes: Routes | None = None,
    ) -> None:
        self.queue = queue
        self.dead_letter_queue = dead_letter_queue
        self.user_id = connection_user(broker)  # stamped on every dead letter (``identity`` module)
        # How dead letters reach the dead-letter queue (its exchange when provisioned).
        self._routes = routes if routes is not None else Routes()
        self._conn: pika.BlockingConnection | None = None
        self._prefetch = prefetch
        # Deliveries for the application; None is put by close() to wake a waiting get().
        self._inbox: queue_mod.Queue[RabbitDelivery | None] = queue_mod.Queue()
        self._channel: BlockingChannel | None = None
        self._dl_channel: BlockingChannel | None = None
        self._closed = False
        # An expired certificate ends the I/O thread: a waiting get() wakes and raises it.
        self._io = IoThread(broker, name, self._on_connect, on_failed=lambda: self._inbox.put(None))
        self._io.start()

    def _on_connect(self, conn: pika.BlockingConnection) -> None:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=self._prefetch)  # per consumer, not global
        dl_channel = conn.channel()
        dl_channel.confirm_delivery()
        # The broker cancels us when the queue is deleted: resubscribe via a reconnect
        # (which waits, with backoff, until the queue is declared again).
        channel.add_on_cancel_callback(lambda _frame: self._io.restart())
        channel.basic_consume(self.queue, on_message_callback=self._on_message)
        self._conn, self._channel, self._dl_channel = conn, channel, dl_channel

    def _on_message(
        self,
        channel: BlockingChannel,
        method: pika.spec.Basic.Deliver,
        props: pika.BasicProperties,
        body: bytes,
    ) -> None:
        self._inbox.put(RabbitDelivery(self, channel, method, props, body))

    def get(self, timeout: float | None = None) -> base.Delivery | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                raise TransportError(f"consumer of {self.queue!r} is closed")
            if self._io.failed is not None:
                raise self._io.failed
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                delivery = self._inbox.get(timeout=remaining)
            except queue_mod.Empty:
                return None
            if delivery is None:
                continue  # woken by close() or a failed I/O thread: the loop head raises
            if delivery._channel is self._channel:
                return delivery
            # From a connection that died: the broker delivers it again.

    def close(self) -> None:
        self._closed = True
        self._io.close()
        self._inbox.put(None)
