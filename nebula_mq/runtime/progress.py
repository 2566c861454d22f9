"""Progress bars for long work (training steps, data preparation, studies).

A bar is drawn (with tqdm) only when the stream, stderr by default, is a
terminal. Under a daemon, in CI or piped to a file nothing is written at all:
the structured logs are the record there, and a bar's carriage returns would
only corrupt them. Callers always get the same object, so code never branches
on whether a bar is shown::

    with progress(total=steps, desc="train") as bar:
        for _ in range(steps):
            ...
            bar.update()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class Progress:
    """Counts work done; forwards it to a tqdm bar when one is shown."""

    def __init__(self, total: int | None, bar: Any | None) -> None:
        self.total = total
        # Units done so far, whether or not a bar is drawn.
        self.n = 0
        self._bar = bar

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)

    def set_postfix(self, **values: float | str) -> None:
        """Figures shown after the bar (e.g. loss=0.31); ignored without a bar."""
        if self._bar is not None:
            self._bar.set_postfix(values, refresh=False)


@contextmanager
def progress(total: int | None, desc: str, *, stream: TextIO | None = None,
             unit: str = "it") -> Iterator[Progress]:
    """A :class:`Progress` for ``total`` units (None: unknown), a bar only on a TTY."""
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
        yield Progress(total, bar)
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
