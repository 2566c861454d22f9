"""Confirmed, persistent, mandatory publishes through a connection's I/O thread."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from nebula_mq.settings import BrokerSettings, TransportSettings

from . import base
from .connection import IoThread
from .retry import PublishStats, publish_patiently


class _DropReturnedWarnings(logging.Filter):
    """pika logs every returned message at WARNING *and* raises UnroutableError; we
    count those waits ourselves, so a federation that is still starting does not
    flood the log with one line per retry."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Published message was returned")


logging.getLogger("pika.adapters.blocking_connection").addFilter(_DropReturnedWarnings())


def message_properties(
    message_id: str,
    headers: Mapping[str, Any] | None,
    correlation_id: str | None,
    reply_to: str | None,
) -> pika.BasicProperties:
    return pika.BasicProperties(
        delivery_mode=pika.DeliveryMode.Persistent,  # survives a broker restart
        content_type="application/octet-stream",
        message_id=message_id,
        headers=dict(headers) if headers else None,
        correlation_id=correlation_id,
        reply_to=reply_to,
    )


class RabbitPublisher(base.Publisher):
    """Publishes to a queue of the local broker via the default exchange.

    Why the default exchange (routing key = queue name) and no per-job
    exchange: queue federation moves messages queue-to-queue, the job's vhost
    already isolates jobs, and ``mandatory`` then reports a missing queue
    directly (Unroutable) instead of a silently dropped message. Thread-safe:
    every publish runs in the connection's own I/O thread.
    """

    def __init__(self, broker: BrokerSettings, settings: TransportSettings, name: str) -> None:
        self._settings = settings
        self._conn: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self.stats = PublishStats()
        self._io = IoThread(broker, name, self._on_connect)
        self._io.start()

    def _on_connect(self, conn: pika.BlockingConnection) -> None:
        self._conn = conn
        self._channel = None
        self._open_channel()

    def _open_channel(self) -> BlockingChannel:
        assert self._conn is not None
        channel = self._conn.channel()
        channel.confirm_delivery()
        self._channel = channel
        return channel

    def publish(
        self,
        queue: str,
        body: bytes | memoryview,
        message_id: str,
        headers: Mapping[str, Any] | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
    ) -> None:
        props = message_properties(message_id, headers, correlation_id, reply_to)
        payload = body if isinstance(body, bytes) else bytes(body)

        def send() -> None:  # runs in the I/O thread
            channel = self._channel
            if channel is None or not channel.is_open:  # closed by an earlier broker error
                channel = self._open_channel()
            channel.basic_publish("", queue, payload, props, mandatory=True)

        publish_patiently(
            lambda: self._io.call(send),
            self._settings.publish_patience_s, self.stats, queue, message_id,
        )

    @property
    def connection_name(self) -> str:
        """As the broker lists it (``rabbitmqctl list_connections name``)."""
        return self._io.name

    @property
    def connected(self) -> bool:
        return self._io.connected.is_set()

    @property
    def reconnects(self) -> int:
        return max(0, self._io.generation - 1)

    def close(self) -> None:
        self._io.close()
