"""Why a worker stopped, read back from its log: the one line ``run`` and ``up`` print.

Every line of a worker's log is a JSON object (``launch.logpipe``). A worker that stops
with an error ends its log with one error record (``runtime.logs.error_record``: the
error's type, its one-line message, and whether a restart can help); a crash the worker
could not describe leaves a Python traceback, whose last line names the exception; a
process killed by a signal leaves nothing. :func:`exit_reason` reads the part of the log
written since the worker last started and says, in that order of preference, which.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The end of a log that can hold a worker's last words (a traceback of a deep stack included).
TAIL_BYTES = 256 * 1024
_TRACEBACK_MARKERS = ("Traceback (most recent call last):", "During handling of the above exception",
                      "The above exception was the direct cause")


@dataclass(frozen=True)
class ExitReason:
    """``text``: why the worker stopped, one line; ``restart_helps``: False when starting it
    again would stop it the same way (the job's config, data, model or placement is wrong)."""

    text: str
    restart_helps: bool = True


def exit_reason(log: Path, since: int, code: int | None) -> ExitReason:
    """Why the worker whose log is ``log`` stopped with exit ``code``, from what it wrote after
    byte ``since`` (where the log ended when it started)."""
    records = _records(log, since)
    for record in reversed(records):
        if record.get("event") == "error" and record.get("message"):
            # A usage error argparse printed (no record of ours) is the command line's fault.
            return ExitReason(str(record["message"]), bool(record.get("restart_helps", False)))
    crash = _last_exception_line(records)
    if crash:
        return ExitReason(crash)
    fatal = next((r for r in reversed(records) if r.get("level") in ("critical", "fatal")), None)
    if fatal is not None:
        return ExitReason(str(fatal.get("line") or fatal.get("event")))
    return ExitReason(describe_exit(code))


def describe_exit(code: int | None) -> str:
    """An exit status as words: ``killed by SIGKILL``, ``exited 3``."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited {code} without saying why"


def _records(log: Path, since: int) -> list[dict[str, Any]]:
    try:
        with log.open("rb") as fh:
            size = fh.seek(0, 2)
            start = max(since, size - TAIL_BYTES)
            fh.seek(start)
            raw = fh.read()
    except OSError:
        return []
    lines = raw.splitlines()[1 if start > since else 0:]  # a line cut by the tail's start is dropped
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _last_exception_line(records: list[dict[str, Any]]) -> str:
    """The exception line that ends the last Python traceback in ``records`` ('' if none)."""
    for record in reversed(records):
        if record.get("source") != "traceback":
            continue
        line = str(record.get("line", ""))
        if line.strip() and not line[0].isspace() and not line.startswith(_TRACEBACK_MARKERS):
            return line.strip()
    return ""
