"""Confirmed, persistent, mandatory publishes through a connection's I/O thread."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from nebula_mq.settings import BrokerSettings, TransportSettings

from . import base
from .connection import IoThread, OnIoThread
from .retry import PublishStats, publish_patiently
from .routing import Routes


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


class RabbitPublisher(OnIoThread, base.Publisher):
    """Publishes to a queue of the local broker through the queue's flow exchange.

    Each queue of a provisioned job has its own direct exchange bound to it
    (routing key = queue name), and roles may write only to the exchanges of
    their flows (``nebula_mq.security.roles``); on a plain broker without those
    exchanges the default exchange is used (``routing.Routes`` decides, once
    per queue). Either way ``mandatory`` reports a missing queue or binding
    (Unroutable) instead of silently dropping the message, and queue federation
    moves messages queue-to-queue behind the exchange. Thread-safe: every
    publish runs in the connection's own I/O thread.
    """

    def __init__(
        self, broker: BrokerSettings, settings: TransportSettings, name: str, routes: Routes | None = None
    ) -> None:
        self._settings = settings
        # Shared with the transport's other publishers: one passive declare per queue.
        self._routes = routes if routes is not None else Routes()
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
            assert self._conn is not None
            exchange = self._routes.exchange(self._conn, queue)
            channel.basic_publish(exchange, queue, payload, props, mandatory=True)

        publish_patiently(
            lambda: self._io.call(send),
            self._settings.publish_patience_s, self.stats, queue, message_id,
        )

    def close(self) -> None:
        self._io.close()
