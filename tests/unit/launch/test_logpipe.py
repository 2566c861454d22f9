"""The log pipe (``nebula_mq.launch.logpipe``): the wrapping of one line, and a log that cannot
be written."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from nebula_mq.launch.logpipe import StreamState, pump, wrap_line


def _wrap(lines: list[bytes], stream: str = "stderr") -> list[dict[str, Any]]:
    state = StreamState()
    out = []
    for raw in lines:
        line = wrap_line(raw, stream, "enc-0", state)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        out.append(json.loads(line))
    return out


def test_a_json_line_passes_unchanged() -> None:
    raw = b'{"event": "step", "step": 3}\n'
    assert wrap_line(raw, "stderr", "enc-0", StreamState()) == raw


def test_a_glog_line_is_paddles_with_its_level() -> None:
    [info, warn] = _wrap([b"I1126 21:09:54.210067 14009 init.cc:251] ENV [CUSTOM_DEVICE_ROOT] is empty.\n",
                          b"W1126 21:09:54.589576 14009 gpu_resources.cc:119] Please NOTE: device: 0\n"])
    assert info["source"] == warn["source"] == "paddle" and (info["level"], warn["level"]) == ("info", "warning")
    assert info["line"] == "I1126 21:09:54.210067 14009 init.cc:251] ENV [CUSTOM_DEVICE_ROOT] is empty."
    assert info["event"] == "stderr" and info["worker"] == "enc-0" and info["timestamp"].endswith("Z")


def test_a_traceback_is_one_source_up_to_its_exception_line_and_through_chains() -> None:
    records = _wrap([b"Traceback (most recent call last):\n", b'  File "x.py", line 1, in <module>\n',
                     b"    boom()\n", b"KeyError: 'a'\n", b"\n",
                     b"During handling of the above exception, another exception occurred:\n", b"\n",
                     b"Traceback (most recent call last):\n", b"RuntimeError: b\n", b"after\n"])
    assert [r["source"] for r in records] == ["traceback"] * 9 + ["text"]
    assert records[3]["line"] == "KeyError: 'a'" and records[-1]["line"] == "after"


def test_a_warning_and_its_source_line() -> None:
    records = _wrap([b"/x/paddle/utils.py:712: UserWarning: No ccache found.\n", b"  warnings.warn(msg)\n",
                     b"  indented text\n"])
    assert [r["source"] for r in records] == ["warning", "warning", "text"]


def test_the_command_lines_error_is_an_error_event() -> None:
    [record] = _wrap([b"nebula-mq: error: no stack in run/stack\n"])
    assert record["event"] == "error" and record["message"] == "no stack in run/stack"
    [usage] = _wrap([b"nebula-mq worker: error: the following arguments are required: --role\n"])
    assert usage["event"] == "error" and usage["message"].startswith("the following arguments")


def test_no_text_is_lost_not_utf8_a_brace_a_line_without_newline() -> None:
    bad, brace, last = _wrap([b"caf\xe9 \xff\n", b"{not json}\n", b"no newline at the end"], stream="stdout")
    assert bad["line"] == "caf\\xe9 \\xff" and bad["event"] == "stdout"
    assert brace["line"] == "{not json}" and last["line"] == "no newline at the end"


def test_a_log_that_cannot_be_written_never_blocks_the_worker(tmp_path: Path) -> None:
    """A full disk (``/dev/full``: every write fails with ENOSPC) drops and counts the lines; the
    pipe is still read, so the writer never blocks. The next line that fits says how many went."""
    read_fd, write_fd = os.pipe()
    full = os.open("/dev/full", os.O_WRONLY)
    dropped = [0]
    with os.fdopen(read_fd, "rb") as source:
        reader = threading.Thread(target=pump, args=(source, "stderr", "tail-0", full, threading.Lock(), dropped),
                                  daemon=True)
        reader.start()
        with os.fdopen(write_fd, "wb") as sink:  # 20,000 lines: far more than a pipe buffers
            for i in range(20_000):
                sink.write(b'{"event": "step", "step": %d}\n' % i)
        reader.join(30)
        assert not reader.is_alive()
    os.close(full)
    assert dropped == [20_000]

    log = tmp_path / "tail-0.log"
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as source, open(log, "wb") as out:
        with os.fdopen(write_fd, "wb") as sink:
            sink.write(b'{"event": "resumed"}\n')
        pump(source, "stderr", "tail-0", out.fileno(), threading.Lock(), dropped)
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert first["event"] == "log_lines_dropped" and first["lines"] == 20_000
    assert second == {"event": "resumed"} and dropped == [0]
