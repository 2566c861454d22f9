"""The publisher's window: the messages submitted and not yet settled, bounded in number and bytes.

``publisher.RabbitPublisher`` admits each message here before its I/O thread sends it, and
settles it here once its handle resolves (confirmed, or failed). A caller waits while
``TransportSettings.publish_window`` messages or ``publish_window_bytes`` bytes are outstanding
(a message larger than the byte window goes alone); every outstanding message settles by its
deadline at the latest (``retry.Patience``), so the wait is bounded. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

M = TypeVar("M", bound=Hashable)


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

    def admit(self, message: M, size: int, then: Callable[[], None]) -> bool:
        """Wait for room, count ``message`` (of ``size`` bytes) as outstanding and call ``then``
        (which hands it on) before the window can close; False, admitting nothing, once it is
        closed."""
        with self._space:
            while self._live and not self._closed and (
                    len(self._live) >= self.messages or self._live_bytes + size > self.size_bytes):
                self._space.wait(0.5)
            if self._closed:
                return False
            self._live[message] = size
            self._live_bytes += size
            self.max_in_flight = max(self.max_in_flight, len(self._live))
            then()
            return True

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
