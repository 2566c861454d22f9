"""Stop requests from signals: the handlers only set a flag.

A Python signal handler runs in the main thread between two bytecodes, so it can
interrupt code that holds a non-reentrant lock (structlog's print lock, a
``threading.Event``'s condition, pika's buffers). A handler that logs, or sets an
``Event``, can then wait for ever on a lock its own thread holds. Here the handler
touches nothing but plain attributes; the worker's loop sees the flag, finishes
the micro-batch in flight, checkpoints, acks and logs.

A user's second Ctrl-C means "now": the process exits at once with status 130,
without a last checkpoint. Nothing is lost by that: checkpoints are written
atomically, and messages are acked only once a checkpoint holding their effect is
durable, so the broker redelivers everything after the last checkpoint on restart.
Only SIGINT counts towards that: one Ctrl-C under ``nebula-mq run`` delivers a
SIGINT from the terminal *and* a SIGTERM forwarded by ``run``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

FORCED_EXIT_STATUS = 130
_FORCED_EXIT_LINE = (b"second interrupt: exiting now without a final checkpoint; "
                     b"messages after the last checkpoint are redelivered on restart\n")


class StopFlag:
    """Set by a signal handler, polled by the worker loop. No lock: see the module doc.

    ``threading.Event.set`` takes a lock; a handler that interrupted the main thread
    inside ``Event.set``/``wait`` would then deadlock. A bool assignment is atomic.
    """

    def __init__(self) -> None:
        self._set = False
        self.signals: list[int] = []  # received, in order (list.append is atomic)

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False
        self.signals.clear()

    def signal_names(self) -> list[str]:
        return [signal.Signals(s).name for s in self.signals]


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def hold_stop_signals() -> None:
    """At a worker process's start: SIGINT and SIGTERM wait, pending, until the worker installs
    its handlers (:func:`install_stop_handlers`). A stop asked for while the process starts (paddle
    loads for seconds and puts its own C-level handlers in, which end the process with a fatal
    error) is then the same clean stop as one asked for later. Held signals of one kind merge:
    two Ctrl-C while the worker starts are one stop request, not an exit at once. Threads
    started meanwhile keep the signals blocked: the main thread, where Python runs handlers,
    receives them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held on this thread for the block (delivered after it): a worker
    process started inside it begins with them held from its first instruction, as the
    child inherits the mask, until its handlers are in."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def install_stop_handlers(flag: StopFlag) -> None:
    """SIGTERM/SIGINT set ``flag``; a second SIGINT exits the process at once (130). Signals
    held since the process started (:func:`hold_stop_signals`) are delivered now, to these."""

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGINT and signal.SIGINT in flag.signals:
            # os.write and os._exit take no Python-level lock.
            os.write(2, _FORCED_EXIT_LINE)
            os._exit(FORCED_EXIT_STATUS)
        flag.signals.append(signum)
        flag.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
