"""One command per host (issue 28): each of two hosts runs its cluster's broker, trusts the
other's CA, and starts its part of the job with ``nebula-mq up JOB --cluster NAME``, which
provisions its broker (federation from the peer the job file names), starts its workers and
supervises them to the end. Three commands per host from a fresh stack directory: ``stack up``,
``certs import-ca``, ``up``. The hosts share no run dir: the job key crosses over the brokers,
sealed to the peer's CA. SIGTERM to ``up`` stops its workers at a checkpoint, and ``up``
again resumes them: the job ends where an uninterrupted one ends, bit for bit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.jobs import ABNET_JOB, final_checkpoint
from tests.fixtures.netns import CLUSTERS, PORT, Host, broker_hosts

pytestmark = [pytest.mark.broker, pytest.mark.paddle]

WORKERS = {"cluster-a": "enc-0", "cluster-b": "dec-0"}


def _job(hosts: dict[str, Host], tmp: Path, name: str, steps: int) -> Path:
    text = ABNET_JOB.format(job_id=f"{name}{os.getpid()}", seed=4, steps=steps, run_dir=tmp / name, batch_size=8,
                            extra="")
    for c in CLUSTERS:
        text += f'\n[clusters.{c}.federation]\nhost = "{hosts[c].hostname}"\nport = {PORT}\n'
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


def _up(host: Host, job: Path, cluster: str, stack: Path, log: Path) -> subprocess.Popen[bytes]:
    """``up`` on ``host``, with a run dir of its own: nothing but the brokers joins the hosts."""
    run_dir = job.parent / f"{job.stem}-{cluster}"
    return host.popen(["env", f"NEBULA__JOB__RUN_DIR={run_dir}", sys.executable, "-m", "nebula_mq", "up", str(job),
                       "--cluster", cluster, "--stack", str(stack), "--timeout", "240"], log)


def _finish(procs: dict[str, subprocess.Popen[bytes]], tmp: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    for cluster, proc in procs.items():
        try:
            code = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(10)
        log = (tmp / f"up-{cluster}.log").read_text()[-3000:]
        assert code == 0, f"{cluster}: `up` exited {code}:\n{log}"


def test_each_host_starts_its_part_with_one_command_and_resumes_after_sigterm(tmp_path: Path) -> None:
    with broker_hosts("up", ("up-a.nebula.test", "up-b.nebula.test"), tmp_path) as (hosts, stacks):
        b = hosts["cluster-b"]
        clean = _job(hosts, tmp_path, "clean", steps=16)
        _finish({c: _up(hosts[c], clean, c, stacks[c], tmp_path / f"up-{c}.log") for c in CLUSTERS}, tmp_path)

        stopped = _job(hosts, tmp_path, "stopped", steps=16)
        procs = {c: _up(hosts[c], stopped, c, stacks[c], tmp_path / f"up-{c}.log") for c in CLUSTERS}
        status = tmp_path / "stopped-cluster-b" / "status" / "dec-0.json"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and '"step": 4' not in (status.read_text() if status.exists() else ""):
            time.sleep(0.2)
        procs["cluster-b"].send_signal(signal.SIGTERM)  # host b is told to stop: its workers checkpoint, exit 0
        code = procs["cluster-b"].wait(120)
        log = (tmp_path / "up-cluster-b.log").read_text()
        assert code == 128 + signal.SIGTERM, log[-3000:]  # `up` itself says it was stopped, not finished
        assert "dec-0: exit 0" in log and "run the same command to resume" in log, log[-3000:]
        stopped_at = final_checkpoint(tmp_path / "stopped-cluster-b", "dec-0").step
        assert 4 <= stopped_at < 16
        procs["cluster-b"] = _up(b, stopped, "cluster-b", stacks["cluster-b"], tmp_path / "up-cluster-b.log")
        _finish(procs, tmp_path)

    for cluster, worker in WORKERS.items():
        a_ck = final_checkpoint(tmp_path / f"clean-{cluster}", worker)
        s_ck = final_checkpoint(tmp_path / f"stopped-{cluster}", worker)
        assert a_ck.step == s_ck.step == 16 and a_ck.digest == s_ck.digest, worker
    # The job key crossed over the brokers, sealed: each host holds the same ring, made on cluster-a.
    for name in ("clean", "stopped"):
        keys = [(tmp_path / f"{name}-{c}" / "keys" / "job.key").read_bytes() for c in CLUSTERS]
        assert keys[0] == keys[1]
    log_b = (tmp_path / "up-cluster-b.log").read_text()
    assert "received sealed from cluster-a" in log_b
    assert "sent sealed to cluster-b" in (tmp_path / "up-cluster-a.log").read_text()
