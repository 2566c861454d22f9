"""SIGTERM unwinds a long command (a bench, the compression study) as Ctrl-C does, so its
``finally`` blocks run: a row's workers are killed, a private stack is taken down, a shaped
link is put back. Once: a second SIGTERM (``timeout``'s, to the whole process group) must not
cut that cleanup short. The caller's own handler (pytest's) comes back afterwards."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

EXIT_CODE = 143  # 128 + SIGTERM, as a shell reports a command SIGTERM ended


def _exit_once(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(EXIT_CODE)


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit(143)`` once and is ignored after."""
    before = signal.signal(signal.SIGTERM, _exit_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
