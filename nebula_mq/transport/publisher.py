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
  were on it with the translated error;
* a **resource alarm** (``connection.blocked``) is waited out, for as long as it lasts (``alarm``).

How long each wait is, what it counts and when to give up is the message's ``retry.Patience``,
the same decisions the in-memory transport of the unit tests takes.

The window (:class:`PublishWindow`), on the callers' side: each message is admitted there before
the I/O thread sends it, and settled once its handle resolves (confirmed, or failed). A caller
waits while ``publish_window`` messages or ``publish_window_bytes`` bytes are outstanding (a
message larger than the byte window goes alone); every outstanding message settles by its deadline
at the latest, so the wait is bounded, except while the broker blocks publishing (a resource
alarm, ``alarm.BrokerAlarm``): then the waits last as long as the alarm, and each turn of them
calls the transport's ``alarm.WaitChecks``, which raise once a stop is requested.

Confirms (:class:`Confirms`), in the I/O thread: a channel in confirm mode numbers what is
published on it 1, 2, ... (a new channel starts again at 1), the tags the broker confirms by. A
message the broker returns (``mandatory``: no queue took it) is acked after the return, so the
return only marks it.

Resends can overtake messages submitted after them; consumers restore order by micro-batch
(``runtime.ordered``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pika
import pika.channel
import pika.frame
import structlog
from pika.adapters.select_connection import IOLoop

from nebula_mq.errors import CertificateError, ConnectionLost, PublishRejected, TransportError, Unroutable
from nebula_mq.settings import BrokerSettings, TransportSettings

from . import base
from .alarm import CLOSE_BLOCKED_S, BrokerAlarm, WaitChecks
from .connection import PIKA_ERRORS, connection_parameters, expired_certificate, translate
from .retry import Backoff, Patience, PublishStats
from .routing import Routes

log = structlog.get_logger(__name__)

# pika logs every return at WARNING; a federation still starting returns many, counted instead.
logging.getLogger("pika.channel").setLevel(logging.ERROR)

# How long the first connection may take before the constructor gives up.
_CONNECT_TIMEOUT_S = 30.0
# Reconnect delays: a broker that restarts is back within seconds.
_RECONNECT = (0.1, 5.0)
# How often a wait looks at its ``interrupt`` (seconds).
_POLL_S = 0.5

M = TypeVar("M", bound=Hashable)


def message_properties(
    message_id: str,
    headers: Mapping[str, Any] | None,
    correlation_id: str | None,
    reply_to: str | None,
    user_id: str | None = None,
) -> pika.BasicProperties:
    """Persistent, opaque bytes, our ids. ``user_id``: the connection's user name
    (``identity.connection_user``), on dead letters; the broker refuses any other."""
    return pika.BasicProperties(
        delivery_mode=pika.DeliveryMode.Persistent,  # survives a broker restart
        content_type="application/octet-stream",
        message_id=message_id,
        headers=dict(headers) if headers else None,
        correlation_id=correlation_id,
        reply_to=reply_to,
        user_id=user_id,
    )


@dataclass(eq=False)
class Unconfirmed:
    """One message until the broker confirms it (or its patience runs out)."""

    exchange: str
    queue: str
    body: bytes
    props: pika.BasicProperties
    patience: Patience
    future: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    returned: bool = False  # the broker returned it (unroutable); its ack follows

    @classmethod
    def of(cls, outgoing: base.Outgoing, exchange: str, patience: Patience) -> Unconfirmed:
        """``outgoing``, to be published through ``exchange``."""
        body = outgoing.body if isinstance(outgoing.body, bytes) else bytes(outgoing.body)
        props = message_properties(outgoing.message_id, outgoing.headers, outgoing.correlation_id, outgoing.reply_to,
                                   outgoing.user_id)
        return cls(exchange, outgoing.queue, body, props, patience)

    @property
    def message_id(self) -> str:
        return str(self.props.message_id)


class Confirms:
    """Delivery tag -> message, for the messages published on the current channel."""

    def __init__(self) -> None:
        self._unconfirmed: dict[int, Unconfirmed] = {}  # in tag order
        self._next_tag = 1

    def new_channel(self) -> None:
        """A channel entered confirm mode: its tags start at 1."""
        self._next_tag = 1

    def sent(self, message: Unconfirmed) -> None:
        """``message`` was published on the current channel, under the next tag."""
        self._unconfirmed[self._next_tag] = message
        self._next_tag += 1

    def returned(self, message_id: str | None) -> None:
        """The broker returned a message: marks the oldest copy of it not yet marked."""
        for message in self._unconfirmed.values():
            if message.message_id == message_id and not message.returned:
                message.returned = True
                return

    def settle(self, tag: int, multiple: bool) -> list[Unconfirmed]:
        """The messages a confirm of ``tag`` settles (each one once)."""
        tags = [t for t in self._unconfirmed if t <= tag] if multiple else [tag]
        return [m for m in (self._unconfirmed.pop(t, None) for t in tags) if m is not None]

    def outcomes(self, method: pika.spec.Basic.Ack | pika.spec.Basic.Nack) -> list[tuple[Unconfirmed, TransportError | None]]:
        """Each message a confirm settles, with None when the broker holds it, or why it must go
        again: nacked (the queue is full) or returned before its ack (no queue took it)."""
        out: list[tuple[Unconfirmed, TransportError | None]] = []
        for message in self.settle(method.delivery_tag, method.multiple):
            if not isinstance(method, pika.spec.Basic.Ack):
                out.append((message, PublishRejected(f"publish to {message.queue!r}: broker nacked (queue full)")))
            elif message.returned:
                message.returned = False
                out.append((message, Unroutable(f"publish to {message.queue!r}: no queue took the message")))
            else:
                out.append((message, None))
        return out

    def take_all(self) -> list[Unconfirmed]:
        """Every message still unconfirmed (their channel is gone), forgotten here."""
        out, self._unconfirmed = list(self._unconfirmed.values()), {}
        return out


def _never() -> None:
    return None


class PublishWindow(Generic[M]):
    """Outstanding messages of one publisher, bounded in number and bytes; see the module docstring.
    Thread-safe."""

    def __init__(self, messages: int, size_bytes: int) -> None:
        self.messages = messages
        self.size_bytes = size_bytes
        self.max_in_flight = 0  # the most ever outstanding at once (tests check the window)
        self._space = threading.Condition()
        # Guarded by _space: each outstanding message with its bytes, and their sum.
        self._live: dict[M, int] = {}
        self._live_bytes = 0
        self._closed = False  # nothing admitted now would settle

    def admit(self, message: M, size: int, then: Callable[[], None], interrupt: Callable[[], None] = _never) -> bool:
        """Wait for room, count ``message`` (of ``size`` bytes) as outstanding and call ``then``
        (which hands it on) before the window can close; False, admitting nothing, once it is
        closed. ``interrupt`` is called at each turn of the wait and may raise to end it."""
        while True:
            with self._space:
                if self._closed:
                    return False
                if not self._live or (len(self._live) < self.messages
                                      and self._live_bytes + size <= self.size_bytes):
                    self._live[message] = size
                    self._live_bytes += size
                    self.max_in_flight = max(self.max_in_flight, len(self._live))
                    then()
                    return True
                self._space.wait(_POLL_S)
            # Outside the lock: a check may take seconds (it may probe the broker), and the I/O
            # thread's ``settle`` must not wait for it.
            interrupt()

    def settle(self, message: M) -> None:
        """``message`` is confirmed or failed: its room is free."""
        with self._space:
            size = self._live.pop(message, None)
            if size is not None:
                self._live_bytes -= size
            self._space.notify_all()

    def pending(self) -> list[M]:
        """Every message outstanding now."""
        with self._space:
            return list(self._live)

    def __len__(self) -> int:
        with self._space:
            return len(self._live)

    def close(self) -> None:
        """Admit nothing more; callers waiting for room return at once."""
        with self._space:
            self._closed = True
            self._space.notify_all()


class InterruptibleHandle(base.PublishHandle):
    """A handle whose ``wait`` calls ``interrupt`` every :data:`_POLL_S` seconds, which may raise
    to end the wait (a stop requested during a broker alarm)."""

    def __init__(self, future: concurrent.futures.Future[None], message_id: str,
                 interrupt: Callable[[], None]) -> None:
        super().__init__(future, message_id)
        self._interrupt = interrupt

    def wait(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._future.done():
            self._interrupt()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TransportError(f"publish of {self.message_id!r}: no confirm within {timeout} s")
            concurrent.futures.wait([self._future], _POLL_S if left is None else min(left, _POLL_S))
        super().wait(0)


class RabbitPublisher(base.Publisher):
    """Publishes to queues of the local broker through each queue's flow exchange.

    Each queue of a provisioned job has its own direct exchange bound to it (routing key = queue
    name), and roles may write only to the exchanges of their flows (``nebula_mq.security.roles``);
    on a plain broker without those exchanges the default exchange is used (``routing.Routes``
    decides, once per queue). ``mandatory`` reports a missing queue or binding instead of silently
    dropping the message. Thread-safe: any thread may submit; the I/O thread does the rest.
    """

    def __init__(
        self, broker: BrokerSettings, settings: TransportSettings, name: str, routes: Routes | None = None,
        alarm: BrokerAlarm | None = None, waits: WaitChecks | None = None,
    ) -> None:
        self._broker = broker
        self._settings = settings
        self.name = name
        self.alarm = alarm if alarm is not None else BrokerAlarm(f"{broker.host}:{broker.port}")
        # Called at each turn of a wait for room or a confirm; may raise to end it.
        self._waits = waits if waits is not None else WaitChecks(self.alarm.check_stop)
        self._params = connection_parameters(broker, name, wait_out_alarms=True)  # bad settings fail here
        # Shared with the transport's other publishers: one passive declare per queue.
        self._routes = routes if routes is not None else Routes()
        self.stats = PublishStats()
        # Every message submitted and not yet settled; closed once the I/O thread ends.
        self._window: PublishWindow[Unconfirmed] = PublishWindow(settings.publish_window,
                                                                 settings.publish_window_bytes)
        # I/O thread only from here on.
        self._ioloop = IOLoop()
        self._conn: pika.SelectConnection | None = None
        self._channel: pika.channel.Channel | None = None
        self._confirms = Confirms()  # the messages on the current channel
        self._waiting: deque[Unconfirmed] = deque()  # to send once a channel is in confirm mode
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

    def _submit(self, outgoing: base.Outgoing) -> base.PublishHandle:
        """Submit one message; blocks only while the window is full. See the module docstring."""
        if self._closing:
            raise self._start_error or TransportError(f"{self.name}: publisher is closed")
        patience_s = self._settings.publish_patience_s
        # The exchange into the queue, learned once per queue and transport.
        exchange = self._routes.learn(self._broker, outgoing.queue, self.name, patience_s, Backoff(*_RECONNECT),
                                      lambda: self._closing)
        message = Unconfirmed.of(outgoing, exchange, Patience(outgoing.queue, outgoing.message_id, patience_s,
                                                              self.stats, self.alarm.clock))
        message.future.add_done_callback(lambda _f: self._window.settle(message))
        if not self._window.admit(message, len(message.body),
                                  lambda: self._ioloop.add_callback_threadsafe(lambda: self._dispatch(message)),
                                  self._waits):
            raise TransportError(f"{self.name}: publisher is closed")
        return InterruptibleHandle(message.future, outgoing.message_id, self._waits)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message submitted so far is confirmed; raise the first failure."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for message in self._window.pending():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            InterruptibleHandle(message.future, message.message_id, self._waits).wait(left)

    @property
    def in_flight(self) -> int:
        return len(self._window)

    @property
    def max_in_flight(self) -> int:
        """The most messages ever outstanding at once (tests check the window)."""
        return self._window.max_in_flight

    def close(self) -> None:
        """Stop; messages not yet confirmed fail with ConnectionLost (call ``flush`` first to wait)."""
        self._closing = True
        self._window.close()
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
            self._window.close()
            self.alarm.unblocked(self.name)  # the connection is gone with the thread
            self._fail_all(self._start_error or ConnectionLost(f"{self.name}: publisher closed"))
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
        self.alarm.watch(conn, self.name)
        conn.channel(on_open_callback=self._on_channel_open)

    def _on_channel_open(self, channel: pika.channel.Channel) -> None:
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(lambda _ch, _method, props, _body: self._confirms.returned(props.message_id))
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self._on_confirm_mode(channel))

    def _on_confirm_mode(self, channel: pika.channel.Channel) -> None:
        self._channel = channel
        self._confirms.new_channel()
        self.generation += 1
        self._reconnect.reset()
        self.connected.set()
        self._started.set()
        while self._waiting and self._channel is channel:
            self._send(self._waiting.popleft())

    def _on_open_error(self, _conn: pika.connection.Connection, exc: BaseException) -> None:
        err = expired_certificate(self._broker) or translate(exc, f"{self.name}: connect")
        if not self._started.is_set() or isinstance(err, CertificateError):  # no retry can succeed
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
        self.alarm.unblocked(self.name)  # a new connection starts unblocked
        lost = translate(reason, self.name)
        if not self._closing:
            log.warning("connection lost", connection=self.name, error=str(lost))
        for message in self._confirms.take_all():  # the broker may hold some: sent again, deduped downstream
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
        for message in self._confirms.take_all():
            self._fail(message, err)
        self._conn.channel(on_open_callback=self._on_channel_open)

    def _dispatch(self, message: Unconfirmed) -> None:
        if self._channel is None:
            self._waiting.append(message)
        else:
            self._send(message)

    def _send(self, message: Unconfirmed) -> None:
        assert self._channel is not None
        try:
            self._channel.basic_publish(message.exchange, message.queue, message.body, message.props,
                                        mandatory=True)
        except PIKA_ERRORS:
            self._waiting.appendleft(message)  # the close callback follows and reconnects
            return
        self._confirms.sent(message)

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        for message, why in self._confirms.outcomes(frame.method):
            if why is not None:
                self._retry(message, why)
            elif not message.future.done():
                message.patience.published()
                message.future.set_result(None)

    def _retry(self, message: Unconfirmed, why: TransportError) -> None:
        """``why`` (one of ``retry.WAITED_OUT``) kept the broker from taking ``message``: send it
        again when its patience says, or fail it."""
        if message.future.done():
            return
        wait = message.patience.next_wait(why)
        if self._closing:
            self._fail(message, ConnectionLost(f"{self.name}: publisher closed before the broker confirmed"))
        elif wait is not None:
            self._ioloop.call_later(wait, lambda: self._dispatch(message))
        else:
            self._fail(message, message.patience.gave_up(why))

    def _fail(self, message: Unconfirmed, err: BaseException) -> None:
        if not message.future.done():
            message.future.set_exception(err)

    def _fail_all(self, err: BaseException) -> None:
        """Every message not settled, wherever it is (on the wire, waiting, or in a retry timer)."""
        for message in self._window.pending():
            self._fail(message, err)
        self._confirms.take_all()
        self._waiting = deque()

    def _shutdown(self) -> None:
        self._fail_all(ConnectionLost(f"{self.name}: publisher closed"))
        if self._conn is not None and not (self._conn.is_closing or self._conn.is_closed):
            self._conn.close()  # _on_closed stops the loop
            if self.alarm.blocks(self.name):  # the broker reads the close only after the alarm
                self._ioloop.call_later(CLOSE_BLOCKED_S, self._ioloop.stop)
        else:
            self._ioloop.stop()
