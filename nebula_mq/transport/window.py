"""The publisher's window: the messages submitted and not yet settled, bounded in number and bytes.

``publisher.RabbitPublisher`` admits each message here before its I/O thread sends it, and
settles it here once its handle resolves (confirmed, or failed). A caller waits while
``TransportSettings.publish_window`` messages or ``publish_window_bytes`` bytes are outstanding
(a message larger than the byte window goes alone); every outstanding message settles by its
deadline at the latest (``retry.Patience``), so the wait is bounded, except while the broker
blocks publishing (a resource alarm, ``alarm.BrokerAlarm``): then the waits here last as long as
the alarm, and each turn of them calls an ``interrupt`` that raises once a stop is requested.
That interrupt is the transport's ``waits.WaitChecks``. Thread-safe.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from nebula_mq.errors import TransportError

from .base import PublishHandle

M = TypeVar("M", bound=Hashable)

# How often a wait looks at its ``interrupt`` (seconds).
_POLL_S = 0.5


def _never() -> None:
    return None


class PublishWindow(Generic[M]):
    """Outstanding messages of one publisher; see the module docstring."""

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


class InterruptibleHandle(PublishHandle):
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
