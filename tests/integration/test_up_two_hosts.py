"""Two hosts, as a user deploys them (issue 28): each of two network namespaces runs its cluster's
broker (``stack up --listen --hostname``), trusts the other's CA and CRL (files exchanged, never a
private key), and starts its part of the job with ``nebula-mq up JOB --cluster NAME``, which
provisions its broker (federation from the peer the job file names), starts its workers and
supervises them to the end. Three commands per host from a fresh stack directory: ``stack up``,
``certs import-ca``, ``up``. The hosts share no run dir: the job key crosses over the brokers,
sealed to the peer's CA. SIGTERM to ``up`` stops its workers at a checkpoint, and ``up``
again resumes them: the job ends where an uninterrupted one ends, bit for bit."""

from __future__ import annotations

import json
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
STEPS = 32  # long enough that the SIGTERM below lands mid-run, a few steps after step 4


def _metric(path: Path, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(path.read_text()) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _step(status: Path) -> int:
    try:
        return int(json.loads(status.read_text()).get("step", 0))
    except (OSError, ValueError):
        return 0


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
        a = hosts["cluster-a"]
        clean = _job(hosts, tmp_path, "clean", steps=STEPS)
        sent_before = a.tx_bytes()
        _finish({c: _up(hosts[c], clean, c, stacks[c], tmp_path / f"up-{c}.log") for c in CLUSTERS}, tmp_path)
        # The activations crossed the veth: host a sent at least what the encoder published.
        published = _metric(tmp_path / "clean-cluster-a" / "metrics" / "enc-0.prom", "nebula_wire_bytes_total",
                            flow="activations", direction="out")
        assert published > 10_000 and a.tx_bytes() - sent_before >= published
        # cluster-b's broker pulls from cluster-a's by name, over TLS checked against that name:
        # its federation link is a connection from b's address to a's AMQPS port.
        params = json.loads(b.nebula("provision", str(clean), "--cluster", "cluster-b", "--dry-run").stdout)["parameters"]
        assert f"amqps://{a.hostname}:{PORT}/" in params[0]["value"]["uri"]
        assert f"server_name_indication={a.hostname}" in params[0]["value"]["uri"]
        peers = a.run("ss", "-tnH", "state", "established", f"( sport = :{PORT} )").stdout
        assert f"{b.address}:" in peers, peers

        stopped = _job(hosts, tmp_path, "stopped", steps=STEPS)
        procs = {c: _up(hosts[c], stopped, c, stacks[c], tmp_path / f"up-{c}.log") for c in CLUSTERS}
        status = tmp_path / "stopped-cluster-b" / "status" / "dec-0.json"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and _step(status) < 4:
            time.sleep(0.1)
        procs["cluster-b"].send_signal(signal.SIGTERM)  # host b is told to stop: its workers checkpoint, exit 0
        code = procs["cluster-b"].wait(120)
        log = (tmp_path / "up-cluster-b.log").read_text()
        assert code == 128 + signal.SIGTERM, log[-3000:]  # `up` itself says it was stopped, not finished
        assert "dec-0: exit 0" in log and "run the same command to resume" in log, log[-3000:]
        stopped_at = final_checkpoint(tmp_path / "stopped-cluster-b", "dec-0").step
        assert 4 <= stopped_at < STEPS
        procs["cluster-b"] = _up(b, stopped, "cluster-b", stacks["cluster-b"], tmp_path / "up-cluster-b.log")
        _finish(procs, tmp_path)

    for cluster, worker in WORKERS.items():
        a_ck = final_checkpoint(tmp_path / f"clean-{cluster}", worker)
        s_ck = final_checkpoint(tmp_path / f"stopped-{cluster}", worker)
        assert a_ck.step == s_ck.step == STEPS and a_ck.digest == s_ck.digest, worker
    # The job key crossed over the brokers, sealed: each host holds the same ring, made on cluster-a.
    for name in ("clean", "stopped"):
        keys = [(tmp_path / f"{name}-{c}" / "keys" / "job.key").read_bytes() for c in CLUSTERS]
        assert keys[0] == keys[1]
    log_b = (tmp_path / "up-cluster-b.log").read_text()
    assert "received sealed from cluster-a" in log_b
    assert "sent sealed to cluster-b" in (tmp_path / "up-cluster-a.log").read_text()
