"""The producer's patience: retry a publish while the broker says "not now"."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from nebula_mq.errors import BackpressureTimeout, ConnectionLost, PublishRejected, Unroutable

from .backoff import Backoff

log = structlog.get_logger(__name__)


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


def publish_patiently(
    attempt: Callable[[], None], patience_s: float, stats: PublishStats, queue: str, message_id: str
) -> None:
    """Call ``attempt`` until it succeeds or ``patience_s`` is spent.

    ``attempt`` raises ``PublishRejected`` (queue full), ``Unroutable`` (no queue)
    or ``ConnectionLost``; each is waited out with backoff and counted. Other
    errors propagate at once. After the patience: ``BackpressureTimeout``, or
    ``ConnectionLost`` if the broker was unreachable the whole last stretch.
    """
    deadline = time.monotonic() + patience_s
    backoff = Backoff(initial=0.02, maximum=0.5)
    while True:
        try:
            attempt()
        except (PublishRejected, Unroutable, ConnectionLost) as exc:
            last: Exception = exc
        else:
            with stats._lock:
                stats.published += 1
            return
        delay = backoff.next_delay()
        with stats._lock:
            if isinstance(last, PublishRejected):
                stats.waits_full += 1
            elif isinstance(last, Unroutable):
                stats.waits_unroutable += 1
            else:
                stats.waits_disconnected += 1
            stats.waited_s += delay
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            log.error("publish gave up", queue=queue, message_id=message_id, last=str(last))
            if isinstance(last, ConnectionLost):
                raise ConnectionLost(f"publish to {queue!r}: broker unreachable for {patience_s} s")
            raise BackpressureTimeout(
                f"publish to {queue!r} not accepted within {patience_s} s: {last}"
            )
        time.sleep(min(delay, remaining))
