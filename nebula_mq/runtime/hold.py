"""A step hold: every worker of a job waits before going past a step named in a file.

``nebula-mq chaos`` starts its workers with ``NEBULA_STEP_HOLD_FILE`` set and writes, before
each fault, the step that no worker may go past until the fault is in (the fault's step plus a
little slack). A fault that blocks the injector (a broker restart, a long cut) thus never lets
the job run on to its end and skip the faults after it, however slow or loaded the machine.
Without the variable there is no hold and :meth:`StepHold.wait` costs nothing.

The file holds one integer; a missing, empty or unreadable file is no hold (the injector
replaces the file atomically, so a worker never reads half of it). A worker waiting at the hold
still stops at once on a stop request; its broker connection stays up meanwhile (the transport's
I/O thread answers heartbeats).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from nebula_mq.atomic import write_atomic

HOLD_FILE_ENV = "NEBULA_STEP_HOLD_FILE"
POLL_S = 0.05


def read_hold(path: Path) -> int | None:
    """The step named in ``path``; None when there is no hold."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None


def set_hold(path: Path, step: int | None) -> None:
    """Hold every worker before it goes past ``step`` (None: release them all)."""
    if step is None:
        path.unlink(missing_ok=True)
    else:
        write_atomic(path, f"{step}\n")


class StepHold:
    """The worker's side of the hold: :meth:`wait` returns once ``step`` may be passed."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    @classmethod
    def from_environment(cls) -> StepHold:
        value = os.environ.get(HOLD_FILE_ENV, "")
        return cls(Path(value) if value else None)

    def wait(self, step: int, stopping: Callable[[], bool]) -> None:
        """Wait while the hold is at or below ``step`` (the step this worker has completed),
        until the hold moves on, is lifted, or ``stopping()`` says stop."""
        if self.path is None:
            return
        while not stopping():
            hold = read_hold(self.path)
            if hold is None or step < hold:
                return
            time.sleep(POLL_S)
