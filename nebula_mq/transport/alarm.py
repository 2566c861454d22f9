"""The local broker's resource alarms, as a transport's publishing connections meet them.

While a RabbitMQ node has a resource alarm on (memory above ``vm_memory_high_watermark``, free
disk below ``disk_free_limit``), it blocks every connection that publishes: it sends
``connection.blocked``, stops reading that connection's socket, and sends
``connection.unblocked`` once the alarm clears. Nothing is lost meanwhile: what the publisher
wrote waits in the socket and in pika's buffer, unconfirmed, and the broker reads, routes and
confirms it after the alarm.

So a publisher (``publisher.RabbitPublisher``) waits through an alarm of any length:

* its connection has no blocked timeout (pika would drop it, and each new connection would be
  blocked again at its first publish: a reconnect loop that ends in a give-up);
* time blocked does not count against ``publish_patience_s`` (:meth:`BrokerAlarm.clock`);
* the one way out is a stop request (:meth:`BrokerAlarm.stop_when`, the worker's stop flag):
  a wait for room in the window or for a confirm then raises ``StopDuringAlarm``, and the
  worker stops without a last checkpoint (it cannot claim sends the broker does not hold);
  the unconfirmed messages are sent again on restart, under the same ids.

One :class:`BrokerAlarm` per transport (its cluster's broker) gathers the state of all its
publishers' connections, logs one warning when the first is blocked and one when the last is
unblocked, and tells its listeners (the worker's status: ``broker_alarm``). Its stop check is one
of the transport's :class:`WaitChecks`, what every turn of a publisher's waits (for room in its
window, for a confirm: ``publisher``) calls so that a wait can end early; a worker adds its own, e.g.
its inbox's watch for a broker that lost the job (``runtime.lost_broker``): a worker waiting for a
confirm from such a broker would otherwise wait out ``publish_patience_s``.

Federation on RabbitMQ 3.10.8, measured on the two TLS nodes of a stack with one in a memory,
then a disk alarm: the federation links ignore alarms at both ends. A *downstream* broker in
alarm goes on pulling: messages published upstream crossed and were delivered to its consumers
within a second, the link's status stayed ``running``, while a publisher of its own on that
broker was blocked (the link writes into it over an internal connection, which the alarm does
not block; ``tests/integration/test_broker_alarms.py`` keeps this). So an alarm does not stop a
flow into the cluster, and a disk alarm does not stop its queues growing. An *upstream* broker
in alarm blocks its own publishers only: the link went on consuming the messages its queue
already held and delivering them downstream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pika.connection
import pika.frame
import structlog

from nebula_mq.errors import StopDuringAlarm

log = structlog.get_logger(__name__)

#: How long closing a blocked connection waits for the broker's close-ok, which comes only
#: after the alarm (the broker reads nothing from a blocked connection).
CLOSE_BLOCKED_S = 1.0

#: Called with the alarm's reason ("low on memory", "low on disk") when the first connection is
#: blocked, and with None once the last one is unblocked.
Listener = Callable[[str | None], None]


class BrokerAlarm:
    """Which connections to one broker are blocked now; see the module docstring. Thread-safe:
    each publisher's I/O thread reports its connection, any thread asks."""

    def __init__(self, where: str) -> None:
        """``where`` names the broker in logs and status (the transport's cluster)."""
        self.where = where
        self._lock = threading.Lock()
        self._blocked: dict[str, str] = {}  # connection name -> reason
        self._since: float | None = None  # monotonic time the first connection was blocked
        self._blocked_s = 0.0  # seconds some connection was blocked, alarms that ended
        self._listeners: list[Listener] = []
        self._stopping: Callable[[], bool] = lambda: False

    @property
    def reason(self) -> str | None:
        """Why the broker blocks us now ("low on memory"); None when it does not."""
        with self._lock:
            return next(iter(self._blocked.values()), None)

    @property
    def active(self) -> bool:
        return self.reason is not None

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` at each change (from the I/O thread that saw it: keep it short)."""
        with self._lock:
            self._listeners.append(listener)

    def stop_when(self, stopping: Callable[[], bool]) -> None:
        """Waits abandon an alarm once ``stopping()`` is true (a plain flag read: it is polled)."""
        self._stopping = stopping

    def check_stop(self) -> None:
        """Raise ``StopDuringAlarm`` when a stop was requested while the broker blocks us."""
        reason = self.reason
        if reason is not None and self._stopping():
            raise StopDuringAlarm(f"stop requested while {self.where}'s broker blocks publishing ({reason}): "
                                  "unconfirmed messages are not checkpointed and go again on restart")

    def clock(self) -> float:
        """Monotonic seconds that stand still while the broker blocks us (patience deadlines)."""
        with self._lock:
            now = time.monotonic()
            blocked = self._blocked_s + (now - self._since if self._since is not None else 0.0)
        return now - blocked

    def watch(self, conn: pika.connection.Connection, name: str) -> None:
        """Follow the blocked and unblocked notifications of ``conn``, named ``name``."""
        conn.add_on_connection_blocked_callback(lambda _c, frame: self.blocked(name, _reason(frame)))
        conn.add_on_connection_unblocked_callback(lambda _c, _frame: self.unblocked(name))

    def blocks(self, connection: str) -> bool:
        """Whether the broker blocks ``connection`` now."""
        with self._lock:
            return connection in self._blocked

    def blocked(self, connection: str, reason: str) -> None:
        """``connection`` received ``connection.blocked`` with ``reason``."""
        with self._lock:
            first = not self._blocked
            self._blocked[connection] = reason
            if first:
                self._since = time.monotonic()
        if first:
            log.warning("broker alarm: publishing blocked", cluster=self.where, reason=reason, connection=connection,
                        hint="the broker is low on memory or disk; publishers wait, nothing is lost")
            self._tell(reason)

    def unblocked(self, connection: str) -> None:
        """``connection`` was unblocked, or is gone (a new connection starts unblocked)."""
        with self._lock:
            if self._blocked.pop(connection, None) is None or self._blocked:
                return
            waited = time.monotonic() - self._since if self._since is not None else 0.0
            self._blocked_s += waited
            self._since = None
        log.warning("broker alarm cleared", cluster=self.where, blocked_s=round(waited, 1), connection=connection)
        self._tell(None)

    def _tell(self, reason: str | None) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(reason)
            except Exception as exc:  # noqa: BLE001 - a listener never breaks the I/O thread
                log.warning("broker alarm listener failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)


def _reason(frame: pika.frame.Method) -> str:
    return str(getattr(frame.method, "reason", "") or "resource alarm")


class WaitChecks:
    """What a publisher's waits (for room in the window, for a confirm) call at each turn; any
    check may raise to end the wait. One per transport, shared by its publishers; thread-safe."""

    def __init__(self, *checks: Callable[[], None]) -> None:
        """``checks`` run in every thread's waits."""
        self._lock = threading.Lock()
        self._checks: list[tuple[int | None, Callable[[], None]]] = [(None, c) for c in checks]

    def add(self, check: Callable[[], None]) -> Callable[[], None]:
        """Call ``check`` in the waits of the calling thread from now on (a training thread's
        check must not raise in, say, a status publisher's wait); returns its remover."""
        entry = (threading.get_ident(), check)
        with self._lock:
            self._checks.append(entry)

        def remove() -> None:
            with self._lock:
                if entry in self._checks:
                    self._checks.remove(entry)

        return remove

    def __call__(self) -> None:
        me = threading.get_ident()
        with self._lock:
            checks = [check for thread, check in self._checks if thread in (None, me)]
        for check in checks:
            check()
