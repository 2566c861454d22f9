"""The RabbitMQ queue probe: passive declares on one long-lived connection, sizes over HTTPS.

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

from __future__ import annotations

import pika
import pika.exceptions as px
from pika.adapters.blocking_connection import BlockingChannel

from nebula_mq.errors import ConnectionLost
from nebula_mq.settings import BrokerSettings

from .connection import close_quietly, open_connection
from .management import QueueSizes
from .pika_errors import PIKA_ERRORS, translate
from .probe import QueueProbe


class RabbitQueueProbe(QueueProbe):
    """Reads queues of one broker (one vhost) for the thread that uses it; see the module doc."""

    def __init__(self, broker: BrokerSettings, name: str) -> None:
        """``name`` is the connection's name as the broker lists it."""
        self.broker = broker
        self.name = name
        self._conn: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._sizes = QueueSizes(self.broker)
        self.connections = 0  # opened so far: one for a probe whose broker never failed

    def queue_depth(self, queue: str) -> int | None:
        what = f"inspect queue {queue!r}"
        reused = self._conn is not None and self._conn.is_open
        try:
            return self._passive_declare(queue)
        except PIKA_ERRORS as exc:
            self.close()
            err = translate(exc, what)
            if not (reused and isinstance(err, ConnectionLost)):
                raise err from None
        try:  # the connection died while idle: once more, on a new one
            return self._passive_declare(queue)
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

    def _passive_declare(self, queue: str) -> int | None:
        channel = self._open_channel()
        try:
            ok = channel.queue_declare(queue, passive=True)
        except px.ChannelClosedByBroker as exc:
            self._channel = None  # the broker closed the channel; the connection stays
            if exc.reply_code == 404:
                return None
            raise
        return int(ok.method.message_count)

    def _open_channel(self) -> BlockingChannel:
        if self._channel is not None and self._channel.is_open:
            return self._channel
        if self._conn is None or not self._conn.is_open:
            self.close()
            self._conn = open_connection(self.broker, self.name)  # raises TransportError
            self.connections += 1
        self._channel = self._conn.channel()
        return self._channel
