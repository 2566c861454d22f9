"""A worker's log, written through the launcher's log pipe, is JSON lines only.

Real processes started by ``JobProcesses.start``: a ``nebula-mq worker`` that imports
paddle (with glog's verbose lines on) and stops with a typed error, and processes that
crash with a traceback or are killed while writing."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from nebula_mq.launch import JobProcesses

ROOT = Path(__file__).resolve().parents[3]
# Loaded by the worker's interpreter at start-up, before `nebula-mq worker` runs: paddle's import
# and first op write glog lines (GLOG_v) and a UserWarning on fd 2, a library prints on stdout.
SITECUSTOMIZE = """
import paddle
paddle.ones([2]).sum()
print("plain stdout from a library")
"""


def _job(tmp_path: Path, **env: str) -> JobProcesses:
    return JobProcesses(str(ROOT / "config" / "electra-tiny.toml"), str(tmp_path / "no-stack"),
                        env={"NEBULA__JOB__RUN_DIR": str(tmp_path / "run"), **env})


def _records(job: JobProcesses, worker: str) -> list[dict[str, Any]]:
    lines = (job.logs / f"{worker}.log").read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"line {number} of {worker}.log is not JSON: {line!r}")
        assert isinstance(records[-1], dict), line
    return records


def test_a_worker_that_imports_paddle_and_stops_with_an_error_logs_json_only(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    job = _job(tmp_path, GLOG_v="4", GLOG_logtostderr="1", PYTHONPATH=str(site))
    worker = job.processes[0].worker_id
    job.start(worker)
    assert job.wait(worker, timeout=120) == 1
    assert not job.log_pipes  # drained: the pipe has written everything and exited
    records = _records(job, worker)
    glog = [r for r in records if r.get("source") == "paddle"]
    assert glog and all(r["event"] == "stderr" and r["line"][0] in "IWEF" for r in glog)
    assert any(r.get("source") == "warning" and "UserWarning" in r["line"] for r in records)
    assert {"event": "stdout", "line": "plain stdout from a library"}.items() <= records[
        [r.get("line") for r in records].index("plain stdout from a library")].items()
    [error] = [r for r in records if r["event"] == "error"]
    assert error["error"] == "StackError" and error["message"].startswith(f"no stack in {tmp_path / 'no-stack'}")
    assert error["level"] == "error"


CRASH = """
import json, os, signal, sys
print(json.dumps({"event": "started", "level": "info"}), file=sys.stderr, flush=True)
print("a line outside structlog", file=sys.stderr, flush=True)
if sys.argv[1] == "kill":
    for i in range(5000):
        os.write(2, b"line %d\\n" % i)
    os.kill(os.getpid(), signal.SIGKILL)
raise RuntimeError("boom")
"""


@pytest.mark.parametrize("how", ["traceback", "kill"])
def test_a_crash_and_a_kill_reach_the_log_as_json_lines_with_every_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    job = _job(tmp_path)
    worker = job.processes[0].worker_id
    monkeypatch.setattr(job, "command", lambda _w: [sys.executable, "-c", CRASH, how])
    job.start(worker)
    code = job.wait(worker, timeout=60)
    records = _records(job, worker)
    assert records[0]["event"] == "started" and records[1]["line"] == "a line outside structlog"
    if how == "kill":
        assert code == -signal.SIGKILL
        assert [r["line"] for r in records[2:]] == [f"line {i}" for i in range(5000)]
    else:
        assert code == 1
        tb = [r for r in records if r.get("source") == "traceback"]
        assert tb[0]["line"] == "Traceback (most recent call last):" and tb[-1]["line"] == "RuntimeError: boom"
