"""Connections from ``BrokerSettings``, each owned by one dedicated I/O thread.

pika is not thread-safe and ``BlockingConnection`` answers heartbeats only
while some thread is inside it. So every connection lives in an ``IoThread``
that loops ``process_data_events``; other threads hand it work with
``call(fn)``, which goes through ``add_callback_threadsafe`` (pika's only
thread-safe entry point) and waits for the result. Compute can then run for
minutes in the application thread without the broker declaring us dead.

The thread reconnects with exponential backoff and jitter when the connection
drops, and runs its ``on_connect`` hook (open channels, re-subscribe) on every
new connection. ``generation`` counts connections, so callers can tell that a
delivery tag belongs to a connection that no longer exists. An expired client
certificate ends the thread instead (no attempt can succeed): ``failed`` holds the
``CertificateError``, ``call`` raises it, and ``on_failed`` wakes whoever waits
for deliveries (the consumer's ``get``).

pika's exceptions are translated into ``nebula_mq.errors`` here (:func:`translate`), the only
place that knows them: every pika call of the transport catches :data:`PIKA_ERRORS`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ssl
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pika
import pika.exceptions as px
import structlog
from pika.adapters.utils.connection_workflow import AMQPConnectionWorkflowFailed, AMQPConnectorException

from nebula_mq.errors import (
    AccessRefused, CertificateError, ConnectionLost, PublishRejected, TransportError, Unroutable,
)
from nebula_mq.settings import BrokerSettings

from .identity import check_not_expired
from .retry import Backoff
from .tls import ssl_context as ssl_context  # where callers have always found it

# Everything a pika call can raise that we translate; catch these at the boundary.
PIKA_ERRORS: tuple[type[BaseException], ...] = (
    px.AMQPError, AMQPConnectorException, ssl.SSLError, OSError,
)

_ACCESS_CODES = {403, 530}  # ACCESS_REFUSED, NOT_ALLOWED (vhost)

# TLS alerts by which a broker refuses our certificate, and what to do about each.
_REFUSED_CERTIFICATE = {
    "CERTIFICATE_EXPIRED": "the broker refused this client's certificate as expired: `nebula-mq certs rotate` "
                           "gives it a new one (or the clocks of this host and the broker disagree)",
    "CERTIFICATE_REVOKED": "the broker refused this client's certificate as revoked: the worker needs its "
                           "new files (`nebula-mq certs rotate` writes them)",
}


def _tls_hint(text: str) -> str:
    """`` (what the broker's TLS alert in ``text`` means)``, or "" for any other error."""
    upper = text.upper()
    return next((f" ({hint})" for alert, hint in _REFUSED_CERTIFICATE.items() if alert in upper), "")


def translate(exc: BaseException, what: str) -> TransportError:
    """The nebula error for a pika exception raised while doing ``what``."""
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, px.NackError):
        return PublishRejected(f"{what}: broker nacked (queue full)")
    if isinstance(exc, px.UnroutableError):
        return Unroutable(f"{what}: no queue took the message")
    if isinstance(exc, (px.ProbableAuthenticationError, px.ProbableAccessDeniedError,
                        px.AuthenticationError)):
        return AccessRefused(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, AMQPConnectionWorkflowFailed):
        causes = exc.exceptions
        inner = [translate(c, what) for c in causes]
        for err in inner:
            if isinstance(err, AccessRefused):
                return err
        text = "; ".join(str(c) for c in causes)
        return ConnectionLost(f"{what}: cannot connect: {text}{_tls_hint(text)}")
    if isinstance(exc, px.ChannelClosedByBroker):
        if exc.reply_code in _ACCESS_CODES:
            return AccessRefused(f"{what}: {exc.reply_code} {exc.reply_text}")
        return TransportError(f"{what}: channel closed by broker: {exc.reply_code} {exc.reply_text}")
    if isinstance(exc, px.ConnectionClosedByBroker):
        if exc.reply_code in _ACCESS_CODES:
            return AccessRefused(f"{what}: {exc.reply_code} {exc.reply_text}")
        return ConnectionLost(f"{what}: connection closed by broker: {exc.reply_code} {exc.reply_text}")
    if isinstance(exc, ssl.SSLError):
        return ConnectionLost(f"{what}: TLS: {exc}{_tls_hint(str(exc))}")
    if isinstance(exc, (px.AMQPConnectionError, px.ConnectionWrongStateError,
                        px.ChannelWrongStateError, px.StreamLostError, OSError)):
        return ConnectionLost(f"{what}: {type(exc).__name__}: {exc}{_tls_hint(str(exc))}")
    if isinstance(exc, AMQPConnectorException):
        return ConnectionLost(f"{what}: cannot connect: {exc}")
    return TransportError(f"{what}: {type(exc).__name__}: {exc}")


# What a connection attempt may raise: ours (TLS, refused) and pika's.
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (TransportError, *PIKA_ERRORS)

log = structlog.get_logger(__name__)

T = TypeVar("T")

# A broker under a memory or disk alarm blocks a connection at its first publish and stops
# reading it. A connection that publishes only now and then (the control connections, the queue
# probe's status messages) is dropped after this long blocked, so the thread that uses it is not
# stuck for the whole alarm. Publishers wait alarms out instead (``alarm`` module).
BLOCKED_CONNECTION_TIMEOUT_S = 60.0
# A publisher waits out an alarm while heartbeats (sent to blocked connections too) say the
# broker lives; with heartbeats off it gives up after this, or a dead broker goes unnoticed.
BLOCKED_WITHOUT_HEARTBEATS_S = 6 * 3600.0
# How often the I/O loop looks at its stop flag when nothing happens.
_POLL_S = 0.2


def connection_parameters(broker: BrokerSettings, name: str = "nebula-mq", *,
                          wait_out_alarms: bool = False) -> pika.ConnectionParameters:
    """``wait_out_alarms``: never drop the connection while the broker blocks it (a publisher's);
    otherwise after :data:`BLOCKED_CONNECTION_TIMEOUT_S`."""
    try:
        broker.validate()
    except ValueError as exc:
        raise TransportError(f"broker settings: {exc}") from None
    credentials: pika.credentials.PlainCredentials | pika.credentials.ExternalCredentials
    if broker.tls:
        ssl_options = pika.SSLOptions(ssl_context(broker), server_hostname=broker.server_name)
        credentials = pika.credentials.ExternalCredentials()
    else:
        ssl_options = None
        credentials = pika.PlainCredentials(broker.username, broker.password)
    return pika.ConnectionParameters(
        host=broker.host,
        port=broker.port,
        virtual_host=broker.vhost,
        credentials=credentials,
        ssl_options=ssl_options,
        heartbeat=broker.heartbeat_s,
        blocked_connection_timeout=(BLOCKED_CONNECTION_TIMEOUT_S if not wait_out_alarms
                                    else None if broker.heartbeat_s > 0 else BLOCKED_WITHOUT_HEARTBEATS_S),
        connection_attempts=1,  # our own loop retries, with jitter
        socket_timeout=10,
        client_properties={"connection_name": name},
    )


def expired_certificate(broker: BrokerSettings) -> CertificateError | None:
    """Why no connection to ``broker`` can succeed, if that is an expired client certificate
    (a publisher asks once an attempt failed: its parameters were built at its start)."""
    if not broker.tls:
        return None
    try:
        check_not_expired(broker.cert_file)
    except CertificateError as exc:
        return exc
    except TransportError:  # unreadable now (half rotated): the next attempt reads it again
        pass
    return None


def open_connection(broker: BrokerSettings, name: str = "nebula-mq") -> pika.BlockingConnection:
    params = connection_parameters(broker, name)
    try:
        return pika.BlockingConnection(params)
    except PIKA_ERRORS as exc:
        err = translate(exc, f"connect to {broker.host}:{broker.port}/{broker.vhost}")
        if isinstance(err, AccessRefused) and broker.tls and "Login was refused" in str(err):
            # The broker knows no user for this certificate's CN on this vhost: most often a job
            # nobody provisioned on this broker.
            raise AccessRefused(
                f"{broker.host}:{broker.port} refused the login of this worker's certificate ({broker.cert_file}) "
                f"on vhost {broker.vhost}: is the job provisioned on this broker? `nebula-mq provision "
                f"JOB.toml --cluster NAME` does it (`nebula-mq run` does it on the local stack)") from None
        raise err from None


@contextlib.contextmanager
def short_connection(broker: BrokerSettings, name: str, what: str) -> Iterator[pika.BlockingConnection]:
    """A connection of its own for one short task, closed when the block ends; a pika error in
    the block comes out translated, as ``what`` failing (a failed connect is a TransportError)."""
    conn = open_connection(broker, name)
    try:
        yield conn
    except PIKA_ERRORS as exc:
        raise translate(exc, what) from None
    finally:
        close_quietly(conn)


class IoThread:
    """One connection, one thread; see the module docstring."""

    def __init__(
        self,
        broker: BrokerSettings,
        name: str,
        on_connect: Callable[[pika.BlockingConnection], None],
        on_failed: Callable[[], None] = lambda: None,
    ) -> None:
        self._broker = broker
        self.name = name
        self._on_connect = on_connect
        self._on_failed = on_failed
        # Why no connection can be made any more (an expired certificate); None while one can.
        self.failed: CertificateError | None = None
        self._lock = threading.Lock()
        self._conn: pika.BlockingConnection | None = None
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._stop = threading.Event()
        self._restart = threading.Event()  # drop this connection and make a new one
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"pika-io-{name}", daemon=True)
        self.generation = 0  # connections made so far; bumps on every reconnect
        self.connected = threading.Event()

    def start(self) -> None:
        """Connect once; raise the translated error if that first attempt fails."""
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    def in_io_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run ``fn`` in the I/O thread and return its result (or raise its error).

        Raises ``ConnectionLost`` when there is no connection now or it drops
        before ``fn`` finished; pika errors from ``fn`` come back translated.
        """
        if self.in_io_thread():
            return fn()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            with self._lock:
                self._pending.discard(future)
            if future.done():  # already failed as lost
                return
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, not swallowed
                future.set_exception(exc)

        with self._lock:
            conn = self._conn
            if conn is None:
                if self.failed is not None:
                    raise self.failed
                raise ConnectionLost(f"{self.name}: not connected")
            self._pending.add(future)
            try:
                conn.add_callback_threadsafe(run)
            except PIKA_ERRORS:
                self._pending.discard(future)
                raise ConnectionLost(f"{self.name}: connection closed") from None
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TransportError(f"{self.name}: no answer within {timeout} s") from None
        except PIKA_ERRORS as exc:
            raise translate(exc, self.name) from None

    def restart(self) -> None:
        """Reconnect (from the I/O thread, e.g. when the broker cancelled a consumer)."""
        self._restart.set()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            conn = self._conn
        if conn is not None:
            try:
                conn.add_callback_threadsafe(lambda: None)  # wake the loop now
            except PIKA_ERRORS:
                pass
        if self._thread.is_alive() and not self.in_io_thread():
            self._thread.join(timeout=15)

    # ----------------------------------------------------------------- I/O thread

    def _run(self) -> None:
        backoff = Backoff(initial=0.1, maximum=10.0)
        while not self._stop.is_set():
            conn = None
            try:
                conn = open_connection(self._broker, self.name)
                self._on_connect(conn)
            except CertificateError as exc:
                close_quietly(conn)
                self._fail(exc)
                return
            except _CONNECT_ERRORS as exc:
                err = translate(exc, f"{self.name}: connect")
                close_quietly(conn)
                if not self._started.is_set():
                    self._start_error = err
                    self._started.set()
                    return
                delay = backoff.next_delay()
                log.warning("reconnect failed", connection=self.name, error=str(err), retry_in=delay)
                self._stop.wait(delay)
                continue
            backoff.reset()
            with self._lock:
                self._conn = conn
                self.generation += 1
            self.connected.set()
            self._started.set()
            self._loop(conn)
        self._started.set()

    def _fail(self, err: CertificateError) -> None:
        """No connection can be made any more: said once, and the callers told."""
        self.failed = err
        if not self._started.is_set():
            self._start_error = err
            self._started.set()
            return
        log.error("cannot reconnect", connection=self.name, error=str(err))
        self._on_failed()

    def _loop(self, conn: pika.BlockingConnection) -> None:
        try:
            self._restart.clear()
            while not self._stop.is_set() and not self._restart.is_set() and conn.is_open:
                conn.process_data_events(time_limit=_POLL_S)
        except PIKA_ERRORS as exc:
            log.warning("connection lost", connection=self.name, error=str(translate(exc, self.name)))
        finally:
            self.connected.clear()
            with self._lock:
                self._conn = None
            close_quietly(conn)
            with self._lock:
                pending, self._pending = self._pending, set()
            for future in pending:
                if not future.done():
                    future.set_exception(ConnectionLost(f"{self.name}: connection lost"))


def close_quietly(connection: pika.BlockingConnection | None) -> None:
    """Close ``connection`` (None: nothing to close); a connection already closed or dead is
    left as it is, and the errors of closing one that died meanwhile are ignored."""
    if connection is not None and connection.is_open:
        try:
            connection.close()
        except PIKA_ERRORS:
            pass


class OnIoThread:
    """Connection facts of a publisher or consumer that owns an :class:`IoThread` as ``_io``."""

    _io: IoThread

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
