"""The reader between a worker's stdout/stderr and its log file: every line becomes JSON.

A worker logs through structlog (JSON lines, ``runtime.logs``), but other writers
share its file descriptors: paddle's C++ glog lines, Python warnings raised before
logging is configured, a traceback of a crash, the faulthandler, a library's
``print``. The launcher (``JobProcesses.start``) gives each worker two pipes and
starts this module as a separate small process that reads them:

* a line that is already a JSON object goes to the log unchanged;
* any other line is wrapped, its text intact (bytes that are not UTF-8 as
  backslash escapes): ``{"event": "stderr", "line": ..., "source": "paddle"}``,
  with ``source`` ``paddle`` (a glog line), ``traceback``, ``warning`` or ``text``,
  and the level a glog line or warning states;
* the command line's one-line error (``nebula-mq: error: ...``) becomes
  ``{"event": "error", "message": ...}``; a worker the launcher starts prints its
  error as JSON itself, with the error's type (``runtime.logs.error_record``).

Being its own process, the reader outlives the worker: what a worker wrote just
before a ``kill -9``, a segfault or glog's fatal abort is still in the pipe and
reaches the log. It ignores SIGINT, SIGTERM and SIGHUP (a terminal's Ctrl-C goes to
the whole process group) and exits when every writer has closed the pipes.

Why a worker stopped is read back from its log (:func:`exit_reason`, the one line ``run`` and
``up`` print): a worker that stops with an error ends its log with one error record
(``runtime.logs.error_record``: the error's type, its one-line message, and whether a restart
can help); a crash the worker could not describe leaves a Python traceback, whose last line
names the exception; a process killed by a signal leaves nothing.

Run as ``python -m nebula_mq.launch.logpipe LOG WORKER STDOUT_FD STDERR_FD``; it
imports only the standard library.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

# glog: "I1126 21:09:54.210067 14009 init.cc:251] text" (severity, date, time, thread, file:line).
_GLOG = re.compile(r"^([IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+\s+[^\]\s]+:\d+\] ")
_GLOG_LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "critical"}
# warnings.showwarning: "path.py:712: UserWarning: message".
_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")
# The command line's error line (``nebula-mq: error:``, argparse's ``nebula-mq worker: error:``).
_CLI_ERROR = re.compile(r"^nebula-mq(?: [\w-]+)?: error: (.*)$")
# The lines that start a traceback, or chain another one to it.
_TRACEBACK_HEADS = ("Traceback (most recent call last):", "During handling of the above exception",
                    "The above exception was the direct cause")
# The end of a log that can hold a worker's last words (a traceback of a deep stack included).
TAIL_BYTES = 256 * 1024


@dataclass
class StreamState:
    """Per stream: whether the lines read are inside a Python traceback, or just after a
    warning's first line (its second line quotes the source, indented)."""

    in_traceback: bool = False
    traceback_ended: bool = False
    after_warning: bool = False


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def as_json_object(text: str) -> bool:
    """Whether ``text`` (one line, no newline) is a JSON object already."""
    if not (text.startswith("{") and text.endswith("}")):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def wrap_line(raw: bytes, stream: str, worker: str, state: StreamState) -> bytes:
    """One line a worker wrote on ``stream`` (``stdout`` or ``stderr``) as one JSON line."""
    text = raw.rstrip(b"\r\n").decode("utf-8", "backslashreplace")
    if as_json_object(text.strip()):
        return text.strip().encode() + b"\n"
    record: dict[str, Any] = {"event": stream, "line": text, "worker": worker, "timestamp": _now()}
    after_warning, state.after_warning = state.after_warning, False
    ended, state.traceback_ended = state.traceback_ended, False
    starts = text.startswith(_TRACEBACK_HEADS)
    if state.in_traceback or starts or (ended and not text.strip()):
        record.update(source="traceback", level="error")
        # A traceback ends with its exception line, the first one not indented; blank lines
        # after it may lead to a chained one ("During handling of the above exception...").
        state.in_traceback = starts or (state.in_traceback and (not text or text[0].isspace()))
        state.traceback_ended = not state.in_traceback
    elif (glog := _GLOG.match(text)) is not None:
        record.update(source="paddle", level=_GLOG_LEVELS[glog.group(1)])
    elif _WARNING.match(text) or (after_warning and text[:1].isspace()):
        record.update(source="warning", level="warning")
        state.after_warning = not after_warning
    elif (error := _CLI_ERROR.match(text)) is not None:
        record = {"event": "error", "message": error.group(1), "line": text, "source": "cli", "level": "error",
                  "worker": worker, "timestamp": _now()}
    else:
        record.update(source="text", level="info" if stream == "stdout" else "warning")
    return json.dumps(record, sort_keys=True).encode() + b"\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def pump(source: BinaryIO, stream: str, worker: str, log_fd: int, lock: threading.Lock,
         dropped: list[int]) -> None:
    """Copy ``source`` to ``log_fd`` line by line, wrapped, until end of file. A line the log
    cannot take (a full or read-only disk) is dropped and counted, and reading goes on: a pipe
    nobody reads would block the worker at its next log line. The first line that fits again is
    preceded by one ``log_lines_dropped`` record."""
    state = StreamState()
    for raw in iter(source.readline, b""):
        line = wrap_line(raw, stream, worker, state)
        with lock:  # one line per write; the two streams never tear each other's lines
            try:
                if dropped[0]:
                    note = {"event": "log_lines_dropped", "lines": dropped[0], "level": "warning",
                            "worker": worker, "timestamp": _now()}
                    _write_all(log_fd, json.dumps(note, sort_keys=True).encode() + b"\n")
                    dropped[0] = 0
                _write_all(log_fd, line)
            except OSError:
                dropped[0] += 1


def main(argv: Sequence[str]) -> int:
    log_path, worker, out_fd, err_fd = argv[0], argv[1], int(argv[2]), int(argv[3])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())  # the launcher starts it with stop signals held
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lock = threading.Lock()
    streams = [(os.fdopen(out_fd, "rb"), "stdout"), (os.fdopen(err_fd, "rb"), "stderr")]
    dropped = [0]  # lines the log could not take since the last one it did, both streams
    threads = [threading.Thread(target=pump, args=(f, name, worker, log_fd, lock, dropped), name=f"logpipe-{name}")
               for f, name in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.close(log_fd)
    return 0


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
        if line.strip() and not line[0].isspace() and not line.startswith(_TRACEBACK_HEADS):
            return line.strip()
    return ""


if __name__ == "__main__":  # pragma: no cover - run by the launcher
    sys.exit(main(sys.argv[1:]))
