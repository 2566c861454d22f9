"""A job's processes never outlive the command that started them: an interrupted wait (Ctrl-C,
or a SIGTERM that unwinds, as every bench's does) kills them before the interruption goes on,
and a stop held while a worker starts finds that worker recorded."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from nebula_mq.launch import JobProcesses

ROOT = Path(__file__).resolve().parents[3]


def test_an_interrupted_wait_kills_the_workers_before_the_interruption_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = JobProcesses(str(ROOT / "config" / "electra-tiny.toml"), str(tmp_path / "tiny"),
                       env={"NEBULA__JOB__RUN_DIR": str(tmp_path / "run")})
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


@contextmanager
def held_then_delivered() -> Iterator[None]:
    yield
    raise KeyboardInterrupt  # the Ctrl-C held while the worker started, delivered as the mask lifts


def test_a_stop_held_while_a_worker_starts_still_finds_the_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = JobProcesses(str(ROOT / "config" / "electra-tiny.toml"), str(tmp_path / "tiny"),
                       env={"NEBULA__JOB__RUN_DIR": str(tmp_path / "run")})
    monkeypatch.setattr("nebula_mq.launch.processes.stop_signals_held", held_then_delivered)
    worker = job.plan.processes[0].worker_id
    try:
        with pytest.raises(KeyboardInterrupt):
            job.start(worker)
        assert worker in job.children
    finally:
        job.signal_all(signal.SIGKILL)
        for child in [*job.children.values(), *job.log_pipes.values()]:
            child.wait(10)
