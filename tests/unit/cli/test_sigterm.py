"""``sigterm_unwinds`` (benches and the compression study): a SIGTERM inside the block raises
``SystemExit(143)`` so ``finally`` blocks run; a second one during that cleanup is ignored;
the caller's handler is back afterwards."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from nebula_mq.cli.sigterm import sigterm_unwinds


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
                    os.kill(os.getpid(), signal.SIGTERM)
                    pytest.fail("SIGTERM did not unwind the block")  # pragma: no cover
                finally:
                    os.kill(os.getpid(), signal.SIGTERM)  # timeout's second signal: ignored
                    cleaned.append(True)
        assert info.value.code == 143 and cleaned == [True] and seen == []
        assert signal.getsignal(signal.SIGTERM) is callers
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)
