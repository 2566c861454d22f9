"""Progress bars for long work (training steps, data preparation, studies).

A bar is drawn (with tqdm) only when the stream, stderr by default, is a
terminal. Under a daemon, in CI or piped to a file, a bar's carriage returns
would only corrupt the output: there a plain line (done/total, rate, ETA and the
figures of ``set_postfix``) is written at most every ``every_s`` seconds, so a
long job is never silent for hours. Callers always get the same object, so code
never branches on whether a bar is shown::

    with progress(total=steps, desc="train") as bar:
        for _ in range(steps):
            ...
            bar.update()

A line that cannot be written because the disk holding the stream is full is skipped
(one ``write_skipped`` warning until a line is written again): progress is never worth
stopping the work for.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from nebula_mq.atomic import SkipWhenFull
from nebula_mq.runtime.logs import get_logger

log = get_logger(__name__)

# Off a terminal: one line at most this often (seconds).
LINE_EVERY_S = 30.0


class Progress:
    """Counts work done; forwards it to a tqdm bar when one is shown, else writes a line at
    most every ``every_s`` seconds to ``stream``."""

    def __init__(self, total: int | None, bar: Any | None, *, desc: str = "", unit: str = "it",
                 stream: TextIO | None = None, every_s: float = LINE_EVERY_S) -> None:
        self.total = total
        # Units done so far, whether or not a bar is drawn.
        self.n = 0
        self._bar = bar
        self.desc, self.unit, self.stream, self.every_s = desc, unit, stream, every_s
        self.postfix: dict[str, float | str] = {}
        self.phase = ""
        self._t0 = self._last_line = time.monotonic()
        self._line_write = SkipWhenFull("progress", _skipped)

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.stream is not None and time.monotonic() - self._last_line >= self.every_s:
            self._last_line = time.monotonic()
            self._line_write(self._write_line)

    def _write_line(self) -> None:
        if self.stream is not None:
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def line(self) -> str:
        """``train: 120/900 (13%), 2.10 it/s, ETA 6m11s, loss=3.21``."""
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        rate = self.n / elapsed
        parts = [f"{self.desc}: {self.n}" + (f"/{self.total} ({100 * self.n / self.total:.0f}%)" if self.total else ""),
                 f"{rate:.2f} {self.unit}/s"]
        if self.total and rate > 0:
            parts.append(f"ETA {_duration((self.total - self.n) / rate)}")
        parts += [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.postfix.items()]
        if self.phase:
            parts.append(self.phase)
        return ", ".join(parts)

    def set_phase(self, text: str) -> None:
        """What is happening now, besides counting (e.g. "evaluating 24 sentences"): the bar's
        description on a terminal, a field of the line elsewhere."""
        if text == self.phase:
            return
        self.phase = text
        if self._bar is not None:
            self._bar.set_description(text or self.desc, refresh=True)

    def set_postfix(self, **values: float | str) -> None:
        """Figures shown after the bar or in the line (e.g. loss=0.31)."""
        self.postfix = dict(values)
        if self._bar is not None:
            self._bar.set_postfix(values, refresh=False)


def _skipped(what: str, problem: str) -> None:
    log.warning("write_skipped", what=what, error=problem, hint="the disk is full: the work goes on")


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@contextmanager
def progress(total: int | None, desc: str, *, stream: TextIO | None = None,
             unit: str = "it", every_s: float = LINE_EVERY_S) -> Iterator[Progress]:
    """A :class:`Progress` for ``total`` units (None: unknown): a bar on a TTY, else a line
    at most every ``every_s`` seconds."""
    out = stream if stream is not None else sys.stderr
    bar = None
    if _is_tty(out):
        try:
            from tqdm import tqdm
        except ImportError:  # tqdm ships with the [train] extra; without it, no bar
            tqdm = None
        if tqdm is not None:
            # A pty with no size set (some `docker exec -t`) reports 0 columns, where
            # tqdm would draw nothing: fall back to a fixed 80-column bar there.
            sized = _columns(out) > 0
            bar = tqdm(total=total, desc=desc, file=out, unit=unit, leave=True,
                       dynamic_ncols=sized, ncols=None if sized else 80)
    try:
        yield Progress(total, bar, desc=desc, unit=unit, stream=out, every_s=every_s)
    finally:
        if bar is not None:
            bar.close()


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False
