"""Apply messages in micro-batch order, exactly once, whatever the broker delivers.

The broker may redeliver (after a crash or a WAN drop), federation may
duplicate (ack-mode on-confirm), and a redelivery may overtake newer messages.
:class:`InOrderBuffer` turns that into a strict sequence: it holds early
arrivals until their turn, drops what was already applied, and refuses indices
so far ahead that the sender could not legitimately have produced them (a
bounded window keeps memory bounded and catches hostile or corrupt input).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from nebula_mq.errors import OutOfWindow, ReplayedMessage

T = TypeVar("T")


@dataclass(frozen=True)
class Ready(Generic[T]):
    index: int
    item: T


class InOrderBuffer(Generic[T]):
    """Releases items strictly in index order, starting at ``next_index``."""

    def __init__(self, next_index: int = 0, window: int = 64) -> None:
        if window < 1:
            raise ValueError("window >= 1")
        self.next_index = next_index
        self.window = window
        self._held: dict[int, T] = {}

    def push(self, index: int, item: T) -> None:
        """Accept an arrival. Raises for indices already applied or outside the window.

        A second copy of an index that is held but not yet released is ignored:
        the first copy wins, and both are byte-identical by construction.
        """
        if index < self.next_index:
            raise ReplayedMessage(f"index {index} already applied (next is {self.next_index})")
        if index >= self.next_index + self.window:
            raise OutOfWindow(
                f"index {index} is beyond the window [{self.next_index}, "
                f"{self.next_index + self.window})"
            )
        self._held.setdefault(index, item)

    def is_duplicate(self, index: int) -> bool:
        return index < self.next_index or index in self._held

    def pop_ready(self) -> Iterator[Ready[T]]:
        """Yield every item whose turn has come; ``next_index`` advances as they go."""
        while self.next_index in self._held:
            item = self._held.pop(self.next_index)
            index = self.next_index
            self.next_index += 1
            yield Ready(index, item)

    def __len__(self) -> int:
        return len(self._held)
