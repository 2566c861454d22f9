"""``sigterm_unwinds`` (benches and the compression study): a SIGTERM inside the block raises
``SystemExit(143)`` so ``finally`` blocks run; a second one during that cleanup is ignored;
the caller's handler is back afterwards."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from nebula_mq.cli.sigterm import sigterm_unwinds


def _signal_self_and_wait(until: Callable[[], bool] = lambda: False, wait_s: float = 5.0) -> None:
    """SIGTERM to this process, then up to ``wait_s`` for its handler: in a process with other
    threads (pytest-xdist's) the signal may land on one of them, and the main thread runs the
    handler a little later."""
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while not until() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_sigterm_unwinds_once_and_the_callers_handler_comes_back() -> None:
    seen: list[int] = []

    def callers(signum: int, frame: Any) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGTERM, callers)
    cleaned = []
    try:
        with pytest.raises(SystemExit) as info:
            with sigterm_unwinds():
                try:
                    _signal_self_and_wait()
                    pytest.fail("SIGTERM did not unwind the block")  # pragma: no cover
                finally:
                    _signal_self_and_wait(wait_s=0.3)  # timeout's second SIGTERM: ignored
                    cleaned.append(True)
        assert info.value.code == 143 and cleaned == [True] and seen == []
        assert signal.getsignal(signal.SIGTERM) is callers
        _signal_self_and_wait(lambda: bool(seen))
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)
