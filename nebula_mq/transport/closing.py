"""What a ``with`` block closes: publishers, consumers and queue probes."""

from __future__ import annotations

import abc
from typing import Self


class Closeable(abc.ABC):
    """Holds a connection, a subscription or a channel until ``close``; a ``with`` block closes it."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what this holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
