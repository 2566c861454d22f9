"""A job's processes never outlive the command that started them: an interrupted wait (Ctrl-C,
or a SIGTERM that unwinds, as every bench's does) kills them before the interruption goes on."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from nebula_mq.launch import JobProcesses

ROOT = Path(__file__).resolve().parents[3]


def test_an_interrupted_wait_kills_the_workers_before_the_interruption_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = JobProcesses(str(ROOT / "config" / "electra-tiny.toml"), str(tmp_path / "tiny"))
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    job.children["generator-0"] = worker

    def interrupted(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("nebula_mq.launch.processes.time", SimpleNamespace(monotonic=time.monotonic,
                                                                           sleep=interrupted))
    try:
        with pytest.raises(KeyboardInterrupt):
            job.wait_all(30.0)
        assert worker.wait(10) == -signal.SIGKILL
    finally:
        worker.kill()
        worker.wait(10)
