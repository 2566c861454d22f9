"""Confirmed, persistent, mandatory publishes with a window of outstanding confirms.

One ``SelectConnection`` per publisher, driven by its own I/O thread (pika's asynchronous
publisher, as its documentation shows it). Callers hand messages over with
``add_callback_threadsafe``; up to ``TransportSettings.publish_window`` of them are on the wire
unconfirmed at once, and the broker's confirms are matched to them by delivery tag (``multiple``
confirms settle every tag up to theirs). A handle (``PublishHandle``) resolves only once the broker
holds its message, so ``publish`` (submit, then wait) keeps the guarantee it always had, and a
caller that submits several before waiting pays one confirm round trip for all of them instead of
one each.

Every decision about a message that did not make it is taken here, in the I/O thread:

* a **nack** (the bounded queue is full: backpressure) or a **return** (no queue took it yet:
  ``mandatory``) sends it again after a jittered backoff;
* a **lost connection** sends every unconfirmed message again on the next connection (the broker
  may have stored some of them: at-least-once, under the same ``message_id``, which consumers
  dedupe);
* after ``publish_patience_s`` the handle fails with ``BackpressureTimeout``, or ``ConnectionLost``
  when the broker was out of reach; a channel the broker closes (403, 404) fails the messages that
  were on it with the translated error.

Resends can overtake messages submitted after them; consumers restore order by micro-batch
(``runtime.ordered``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.channel
import pika.frame
import pika.spec
import structlog
from pika.adapters.select_connection import IOLoop

from nebula_mq.errors import BackpressureTimeout, ConnectionLost, PublishRejected, TransportError, Unroutable
from nebula_mq.settings import BrokerSettings, TransportSettings

from . import base
from .backoff import Backoff
from .connection import connection_parameters, open_connection
from .pika_errors import PIKA_ERRORS, translate
from .retry import PublishStats
from .routing import Routes

log = structlog.get_logger(__name__)

# pika logs every return at WARNING; a federation still starting returns many, counted instead.
logging.getLogger("pika.channel").setLevel(logging.ERROR)

# How long the first connection may take before the constructor gives up.
_CONNECT_TIMEOUT_S = 30.0
# Reconnect delays: a broker that restarts is back within seconds.
_RECONNECT = (0.1, 5.0)


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


@dataclass(eq=False)
class _Message:
    """One message until the broker confirms it (or its patience runs out)."""

    exchange: str
    queue: str
    body: bytes
    props: pika.BasicProperties
    deadline: float
    future: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.02, maximum=0.5))
    returned: bool = False  # the broker returned it (unroutable); its ack follows

    @property
    def message_id(self) -> str:
        return str(self.props.message_id)


class RabbitPublisher(base.Publisher):
    """Publishes to queues of the local broker through each queue's flow exchange.

    Each queue of a provisioned job has its own direct exchange bound to it (routing key = queue
    name), and roles may write only to the exchanges of their flows (``nebula_mq.security.roles``);
    on a plain broker without those exchanges the default exchange is used (``routing.Routes``
    decides, once per queue). ``mandatory`` reports a missing queue or binding instead of silently
    dropping the message. Thread-safe: any thread may submit; the I/O thread does the rest.
    """

    def __init__(
        self, broker: BrokerSettings, settings: TransportSettings, name: str, routes: Routes | None = None
    ) -> None:
        self._broker = broker
        self._settings = settings
        self.name = name
        self._params = connection_parameters(broker, name)  # bad settings fail here, in the caller
        # Shared with the transport's other publishers: one passive declare per queue.
        self._routes = routes if routes is not None else Routes()
        self.stats = PublishStats()
        self.window = settings.publish_window
        self.window_bytes = settings.publish_window_bytes
        self._space = threading.Condition()
        # Guarded by _space: every message submitted and not yet settled, and their bytes.
        self._live: set[_Message] = set()
        self._live_bytes = 0
        self._stopped = False  # the I/O thread has ended: nothing submitted now would settle
        self.max_in_flight = 0  # the most ever outstanding at once (tests check the window)
        # I/O thread only from here on.
        self._ioloop = IOLoop()
        self._conn: pika.SelectConnection | None = None
        self._channel: pika.channel.Channel | None = None
        self._unconfirmed: dict[int, _Message] = {}  # delivery tag -> message, in tag order
        self._waiting: deque[_Message] = deque()  # to send once a channel is in confirm mode
        self._next_tag = 1
        self._reconnect = Backoff(*_RECONNECT)
        self._closing = False
        self.generation = 0  # channels in confirm mode so far; bumps on every reconnect
        self.connected = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"pika-pub-{name}", daemon=True)
        self._thread.start()
        if not self._started.wait(_CONNECT_TIMEOUT_S):
            self.close()
            raise ConnectionLost(f"{name}: no connection to {broker.host}:{broker.port} within {_CONNECT_TIMEOUT_S} s")
        if self._start_error is not None:
            self._thread.join(timeout=5)
            raise self._start_error

    # ------------------------------------------------------------------ callers' side

    @property
    def connection_name(self) -> str:
        """As the broker lists it (``rabbitmqctl list_connections name``)."""
        return self.name

    @property
    def reconnects(self) -> int:
        return max(0, self.generation - 1)

    def publish_async(
        self,
        queue: str,
        body: bytes | memoryview,
        message_id: str,
        headers: Mapping[str, Any] | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
    ) -> base.PublishHandle:
        """Submit one message; blocks only while the window is full. See the module docstring."""
        if self._closing:
            raise TransportError(f"{self.name}: publisher is closed")
        message = _Message(self._exchange(queue), queue, body if isinstance(body, bytes) else bytes(body),
                           message_properties(message_id, headers, correlation_id, reply_to),
                           time.monotonic() + self._settings.publish_patience_s)
        size = len(message.body)
        with self._space:
            # Bounded: every message in flight settles by its deadline at the latest.
            while self._live and not (self._closing or self._stopped) and (
                    len(self._live) >= self.window or self._live_bytes + size > self.window_bytes):
                self._space.wait(0.5)
            if self._closing or self._stopped:
                raise TransportError(f"{self.name}: publisher is closed")
            self._live.add(message)
            self._live_bytes += size
            self.max_in_flight = max(self.max_in_flight, len(self._live))
            message.future.add_done_callback(lambda _f: self._settled(message))
            self._ioloop.add_callback_threadsafe(lambda: self._submit(message))
        return base.PublishHandle(message.future, message_id)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message submitted so far is confirmed; raise the first failure."""
        with self._space:
            pending = list(self._live)
        deadline = None if timeout is None else time.monotonic() + timeout
        for message in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            base.PublishHandle(message.future, message.message_id).wait(left)

    @property
    def in_flight(self) -> int:
        with self._space:
            return len(self._live)

    def _settled(self, message: _Message) -> None:
        with self._space:
            if message in self._live:
                self._live.discard(message)
                self._live_bytes -= len(message.body)
            self._space.notify_all()

    def _exchange(self, queue: str) -> str:
        """The exchange into ``queue``, learned once per queue and transport over a short-lived
        connection; a broker that is away is waited for, as a publish would wait for it."""
        known = self._routes.known(queue)
        if known is not None:
            return known
        deadline = time.monotonic() + self._settings.publish_patience_s
        backoff = Backoff(*_RECONNECT)
        while True:
            try:
                conn = open_connection(self._broker, f"{self.name}-route")
            except ConnectionLost:
                delay = backoff.next_delay()
                if self._closing or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                continue
            try:
                return self._routes.exchange(conn, queue)
            except PIKA_ERRORS as exc:
                raise translate(exc, f"{self.name}: route to {queue!r}") from None
            finally:
                try:
                    conn.close()
                except PIKA_ERRORS:
                    pass

    def close(self) -> None:
        """Stop; messages not yet confirmed fail with ConnectionLost (call ``flush`` first to wait)."""
        self._closing = True
        with self._space:
            self._space.notify_all()
        try:
            self._ioloop.add_callback_threadsafe(self._shutdown)
        except PIKA_ERRORS:
            pass
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=15)

    # ------------------------------------------------------------------ I/O thread

    def _run(self) -> None:
        self._connect()
        try:
            self._ioloop.start()
        finally:
            with self._space:
                self._stopped = True
            self._fail_all(ConnectionLost(f"{self.name}: publisher closed"))
            self._ioloop.close()
            self._started.set()

    def _connect(self) -> None:
        if self._closing:
            self._ioloop.stop()
            return
        self._conn = pika.SelectConnection(
            self._params, on_open_callback=self._on_open, on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed, custom_ioloop=self._ioloop)

    def _on_open(self, conn: pika.connection.Connection) -> None:
        conn.channel(on_open_callback=self._on_channel_open)

    def _on_channel_open(self, channel: pika.channel.Channel) -> None:
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self._on_confirm_mode(channel))

    def _on_confirm_mode(self, channel: pika.channel.Channel) -> None:
        self._channel, self._next_tag = channel, 1
        self.generation += 1
        self._reconnect.reset()
        self.connected.set()
        self._started.set()
        while self._waiting and self._channel is channel:
            self._send(self._waiting.popleft())

    def _on_open_error(self, _conn: pika.connection.Connection, exc: BaseException) -> None:
        err = translate(exc, f"{self.name}: connect")
        if not self._started.is_set():
            self._start_error = err
            self._closing = True
            self._ioloop.stop()
            return
        delay = self._reconnect.next_delay()
        log.warning("reconnect failed", connection=self.name, error=str(err), retry_in=delay)
        self._ioloop.call_later(delay, self._connect)

    def _on_closed(self, _conn: pika.connection.Connection, reason: BaseException) -> None:
        self.connected.clear()
        self._channel = None
        lost = translate(reason, self.name)
        if not self._closing:
            log.warning("connection lost", connection=self.name, error=str(lost))
        unconfirmed, self._unconfirmed = list(self._unconfirmed.values()), {}
        for message in unconfirmed:  # the broker may hold some: sent again, deduped downstream
            self._retry(message, lost if isinstance(lost, ConnectionLost) else ConnectionLost(str(lost)))
        if self._closing:
            self._ioloop.stop()
        else:
            self._ioloop.call_later(self._reconnect.next_delay(), self._connect)

    def _on_channel_closed(self, channel: pika.channel.Channel, reason: BaseException) -> None:
        if channel is not self._channel or self._conn is None or not self._conn.is_open:
            return  # the connection went: _on_closed handles it
        self._channel = None
        err = translate(reason, f"{self.name}: publish")
        log.error("channel closed by the broker", connection=self.name, error=str(err))
        failed, self._unconfirmed = list(self._unconfirmed.values()), {}
        for message in failed:
            self._fail(message, err)
        self._conn.channel(on_open_callback=self._on_channel_open)

    def _submit(self, message: _Message) -> None:
        if self._channel is None:
            self._waiting.append(message)
        else:
            self._send(message)

    def _send(self, message: _Message) -> None:
        assert self._channel is not None
        try:
            self._channel.basic_publish(message.exchange, message.queue, message.body, message.props,
                                        mandatory=True)
        except PIKA_ERRORS:
            self._waiting.appendleft(message)  # the close callback follows and reconnects
            return
        self._unconfirmed[self._next_tag] = message
        self._next_tag += 1

    def _on_return(self, _channel: pika.channel.Channel, _method: pika.spec.Basic.Return,
                   props: pika.spec.BasicProperties, _body: bytes) -> None:
        for message in self._unconfirmed.values():  # the oldest copy not yet marked
            if message.message_id == props.message_id and not message.returned:
                message.returned = True
                return

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        method = frame.method
        tag, ack = method.delivery_tag, isinstance(method, pika.spec.Basic.Ack)
        settled = [t for t in self._unconfirmed if t <= tag] if method.multiple else [tag]
        for t in settled:
            message = self._unconfirmed.pop(t, None)
            if message is None:
                continue
            if not ack:
                self._retry(message, PublishRejected(f"publish to {message.queue!r}: broker nacked (queue full)"))
            elif message.returned:
                message.returned = False
                self._retry(message, Unroutable(f"publish to {message.queue!r}: no queue took the message"))
            elif not message.future.done():
                with self.stats._lock:
                    self.stats.published += 1
                message.future.set_result(None)

    def _retry(self, message: _Message, why: TransportError) -> None:
        if message.future.done():
            return
        delay = message.backoff.next_delay()
        with self.stats._lock:
            if isinstance(why, PublishRejected):
                self.stats.waits_full += 1
            elif isinstance(why, Unroutable):
                self.stats.waits_unroutable += 1
            else:
                self.stats.waits_disconnected += 1
            self.stats.waited_s += delay
        if self._closing:
            self._fail(message, ConnectionLost(f"{self.name}: publisher closed before the broker confirmed"))
            return
        remaining = message.deadline - time.monotonic()
        if remaining > 0:
            self._ioloop.call_later(min(delay, remaining), lambda: self._submit(message))
            return
        log.error("publish gave up", queue=message.queue, message_id=message.message_id, last=str(why))
        patience = self._settings.publish_patience_s
        if isinstance(why, ConnectionLost):
            self._fail(message, ConnectionLost(f"publish to {message.queue!r}: broker unreachable for {patience} s"))
        else:
            self._fail(message, BackpressureTimeout(
                f"publish to {message.queue!r} not accepted within {patience} s: {why}"))

    def _fail(self, message: _Message, err: BaseException) -> None:
        if not message.future.done():
            message.future.set_exception(err)

    def _fail_all(self, err: BaseException) -> None:
        """Every message not settled, wherever it is (on the wire, waiting, or in a retry timer)."""
        with self._space:
            live = list(self._live)
        for message in live:
            self._fail(message, err)
        self._unconfirmed, self._waiting = {}, deque()

    def _shutdown(self) -> None:
        self._fail_all(ConnectionLost(f"{self.name}: publisher closed"))
        if self._conn is not None and not (self._conn.is_closing or self._conn.is_closed):
            self._conn.close()  # _on_closed stops the loop
        else:
            self._ioloop.stop()
