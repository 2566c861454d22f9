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
from typing import Any, BinaryIO

# glog: "I1126 21:09:54.210067 14009 init.cc:251] text" (severity, date, time, thread, file:line).
_GLOG = re.compile(r"^([IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+\s+[^\]\s]+:\d+\] ")
_GLOG_LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "critical"}
# warnings.showwarning: "path.py:712: UserWarning: message".
_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")
# The command line's error line (``nebula-mq: error:``, argparse's ``nebula-mq worker: error:``).
_CLI_ERROR = re.compile(r"^nebula-mq(?: [\w-]+)?: error: (.*)$")
_TRACEBACK_START = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


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
    if (state.in_traceback or text.startswith(_TRACEBACK_START) or text.startswith(_CHAINED)
            or (ended and not text.strip())):
        record.update(source="traceback", level="error")
        # A traceback ends with its exception line, the first one not indented; blank lines
        # after it may lead to a chained one ("During handling of the above exception...").
        starts = text.startswith((_TRACEBACK_START, *_CHAINED))
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


if __name__ == "__main__":  # pragma: no cover - run by the launcher
    sys.exit(main(sys.argv[1:]))
