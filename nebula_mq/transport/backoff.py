"""Exponential backoff with jitter, for publish retries and reconnects."""

from __future__ import annotations

import random


class Backoff:
    """Delays that double up to ``maximum``; each is drawn from [d/2, d].

    The jitter keeps many workers that lost the same broker from reconnecting
    in lock-step.
    """

    def __init__(self, initial: float = 0.05, maximum: float = 2.0, factor: float = 2.0) -> None:
        if not 0 < initial <= maximum or factor < 1:
            raise ValueError("need 0 < initial <= maximum and factor >= 1")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._next = initial

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self.maximum, delay * self.factor)
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self._next = self.initial
