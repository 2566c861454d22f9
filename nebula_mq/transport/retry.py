"""Retrying: the waits between tries (:class:`Backoff`, for publish retries, reconnects and the
management API), and the producer's patience: every decision about a publish the broker did not take.

Both publishers decide through :class:`Patience`, one per message: the RabbitMQ publisher
(``publisher.RabbitPublisher``, on its I/O thread, from nacks, returns and lost connections) and
the in-memory one of the unit tests (``memory.MemoryPublisher``, from the errors its broker
raises), so unit tests exercise the decisions the real broker meets.

* What is waited out: ``PublishRejected`` (the bounded queue is full: backpressure),
  ``Unroutable`` (no queue took the message yet) and ``ConnectionLost``; any other error fails
  the publish at once.
* What each wait counts, in the publisher's :class:`PublishStats`, and how long it is: a
  jittered backoff from 20 ms doubling up to 0.5 s.
* When to give up: once ``publish_patience_s`` since the message was submitted are spent, with
  ``BackpressureTimeout``, or ``ConnectionLost`` when the last thing that happened was that the
  broker was out of reach. Those seconds are read on the publisher's ``clock``: for the
  RabbitMQ publisher, one that stands still while the broker blocks publishing (a resource
  alarm, ``alarm.BrokerAlarm.clock``), so an alarm of any length is waited out.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from nebula_mq.errors import BackpressureTimeout, ConnectionLost, PublishRejected, TransportError, Unroutable

log = structlog.get_logger(__name__)

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


#: The errors a publish waits out (and retries after); anything else fails it at once.
WAITED_OUT: tuple[type[TransportError], ...] = (PublishRejected, Unroutable, ConnectionLost)


@dataclass
class PublishStats:
    """Counters of one publisher (read by metrics; written by its publishing thread)."""

    published: int = 0
    # Waits because the bounded queue was full (broker nack): backpressure.
    waits_full: int = 0
    # Waits because no queue took the message (topology/federation not ready yet).
    waits_unroutable: int = 0
    # Waits for a reconnect after the connection dropped.
    waits_disconnected: int = 0
    # Seconds spent waiting, all causes together.
    waited_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_published(self) -> None:
        with self._lock:
            self.published += 1

    def count_wait(self, why: TransportError, delay: float) -> None:
        """One wait of ``delay`` seconds because of ``why`` (one of ``WAITED_OUT``)."""
        with self._lock:
            if isinstance(why, PublishRejected):
                self.waits_full += 1
            elif isinstance(why, Unroutable):
                self.waits_unroutable += 1
            else:
                self.waits_disconnected += 1
            self.waited_s += delay


class Patience:
    """The patience of one message, from its submission on; see the module docstring."""

    def __init__(self, queue: str, message_id: str, patience_s: float, stats: PublishStats,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: monotonic seconds, the time the patience is measured in."""
        self.queue = queue
        self.message_id = message_id
        self.patience_s = patience_s
        self._clock = clock
        self.deadline = clock() + patience_s
        self._stats = stats
        self._backoff = Backoff(initial=0.02, maximum=0.5)

    def published(self) -> None:
        """The broker took the message."""
        self._stats.count_published()

    def next_wait(self, why: TransportError) -> float | None:
        """Count the wait ``why`` (one of ``WAITED_OUT``) causes; the seconds to wait before
        sending again, or None when the patience is spent (then fail with ``gave_up``)."""
        delay = self._backoff.next_delay()
        self._stats.count_wait(why, delay)
        remaining = self.deadline - self._clock()
        return min(delay, remaining) if remaining > 0 else None

    def gave_up(self, why: TransportError) -> TransportError:
        """The error the publish fails with once the patience is spent, ``why`` being the last
        reason it waited (logged here)."""
        log.error("publish gave up", queue=self.queue, message_id=self.message_id, last=str(why))
        if isinstance(why, ConnectionLost):
            return ConnectionLost(f"publish to {self.queue!r}: broker unreachable for {self.patience_s} s")
        return BackpressureTimeout(f"publish to {self.queue!r} not accepted within {self.patience_s} s: {why}")
