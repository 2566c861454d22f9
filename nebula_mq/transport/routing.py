"""Which exchange a publish into one of our queues goes through.

A provisioned job publishes into a queue through that queue's own direct
exchange (``topology.exchange_for_queue``), because broker permissions can
only restrict publishing per exchange (see ``nebula_mq.security.roles``). A
plain broker without provisioning (the default node, development) has no such
exchanges: there the default exchange routes by queue name. :class:`Routes`
learns which case holds, once per queue, with a passive exchange declare
(which RabbitMQ answers without checking permissions), on the caller's
connection or, for a publisher whose connection belongs to its I/O loop, on a
short-lived one (:meth:`Routes.learn`). This is a routing choice, not a
security one: where the flow exchange exists, the roles have no write on
``amq.default``, and a publish through it is refused with 403.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pika
import pika.exceptions as px

from nebula_mq import topology
from nebula_mq.errors import ConnectionLost
from nebula_mq.settings import BrokerSettings

from .retry import Backoff
from .connection import PIKA_ERRORS, close_quietly, open_connection, translate

DEFAULT_EXCHANGE = ""
_NOT_FOUND = 404


class Routes:
    """queue name -> exchange to publish through; shared by a transport's publishers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, str] = {}

    def known(self, queue: str) -> str | None:
        """The exchange learned for ``queue`` (or the default one for a queue outside our
        layout), or None when nobody has looked yet."""
        try:
            topology.exchange_for_queue(queue)
        except ValueError:
            return DEFAULT_EXCHANGE
        with self._lock:
            return self._known.get(queue)

    def exchange(self, conn: pika.BlockingConnection, queue: str) -> str:
        """The flow exchange of ``queue`` if the broker has it, else the default exchange.

        Call it in ``conn``'s I/O thread; a first look opens (and closes) one
        channel of its own, so the caller's channel survives the 404.
        """
        with self._lock:
            known = self._known.get(queue)
        if known is not None:
            return known
        try:
            candidate = topology.exchange_for_queue(queue)
        except ValueError:
            return DEFAULT_EXCHANGE  # not a queue of our layout: only the default exchange reaches it
        channel = conn.channel()
        try:
            channel.exchange_declare(candidate, passive=True)
            found = candidate
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code != _NOT_FOUND:
                raise
            found = DEFAULT_EXCHANGE
        finally:
            if channel.is_open:
                channel.close()
        with self._lock:
            self._known[queue] = found
        return found

    def learn(self, broker: BrokerSettings, queue: str, owner: str, patience_s: float, backoff: Backoff,
              closing: Callable[[], bool]) -> str:
        """:meth:`exchange` over a short-lived connection of ``owner``'s (unless known already).
        A broker that is away is waited for with ``backoff``, as a publish would wait for it:
        ``ConnectionLost`` once ``patience_s`` is spent, or at once when ``closing()``."""
        known = self.known(queue)
        if known is not None:
            return known
        deadline = time.monotonic() + patience_s
        while True:
            try:
                conn = open_connection(broker, f"{owner}-route")
            except ConnectionLost:
                delay = backoff.next_delay()
                if closing() or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                continue
            try:
                return self.exchange(conn, queue)
            except PIKA_ERRORS as exc:
                raise translate(exc, f"{owner}: route to {queue!r}") from None
            finally:
                close_quietly(conn)
