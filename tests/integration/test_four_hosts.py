"""Two clusters of two hosts each (issue 28): each cluster's first host runs its broker (the
only node on the WAN link, shaped by ``tc tbf``); the second reaches it over the cluster's
unshaped LAN. A 2x2 split job runs every rank on a host of its own, each host started with one
command: ``nebula-mq up JOB --cluster C --ranks I`` (``--broker-host`` on a host without the
broker; the hosts of a cluster share a filesystem, the clusters share nothing: the job key
crosses over the brokers, sealed). Federation runs by the broker hosts' names, over TLS checked
against them, and the activations cross the shaped link. A SIGKILL of the remote rank mid-run is
repaired by the supervisors of both its group's hosts (the rank on the broker's host leaves at
its next all-reduce), and the job ends bit-identical to an uninterrupted one, which itself
trains the same model as the 1x1 job. (A SIGTERM or Ctrl-C to ``up`` is ``run``'s stop, the
same supervisor: ``test_stack_cli.py`` stops and resumes it.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.jobs import copy_split_example, final_checkpoint, split_job
from tests.fixtures.lanes import CPU_HEAVY
from tests.fixtures.netns import CLUSTERS, PORT, Host, cluster_broker_hosts

pytestmark = [pytest.mark.broker, pytest.mark.paddle, CPU_HEAVY]

NAMES = (("a1.nebula.test", "a2.nebula.test"), ("b1.nebula.test", "b2.nebula.test"))
WORKERS = ("head-0", "head-0-r1", "tail-0", "tail-0-r1")
STEPS = 16


def _metric(path: Path, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(path.read_text()) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _cluster(worker: str) -> str:
    return "cluster-a" if worker.startswith("head") else "cluster-b"


def _job(tmp: Path, name: str, ranks: int) -> Path:
    a, b = NAMES
    extra = "group_timeout_s = 30\n" + ("" if ranks == 1 else
                                         f'head_ranks = 2\nhead_hosts = ["{a[0]}", "{a[1]}"]\n'
                                         f'tail_ranks = 2\ntail_hosts = ["{b[0]}", "{b[1]}"]\n')
    text = split_job(f"{name}{os.getpid()}", tmp / name, steps=STEPS, forward="none", backward="none", in_flight=1,
                     checkpoint_every=4, extra=extra)
    for c, names in zip(CLUSTERS, NAMES):
        text += f'\n[clusters.{c}.federation]\nhost = "{names[0]}"\nport = {PORT}\n'
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


def _up(host: Host, job: Path, cluster: str, rank: int, stack: Path, log: Path, broker: str = "") -> subprocess.Popen[bytes]:
    """``up`` for one rank on ``host``; the cluster's hosts share its run dir (one filesystem)."""
    run_dir = job.parent / f"{job.stem}-{cluster}"
    cmd = ["env", f"NEBULA__JOB__RUN_DIR={run_dir}", sys.executable, "-m", "nebula_mq", "up", str(job),
           "--cluster", cluster, "--ranks", str(rank), "--stack", str(stack), "--timeout", "240"]
    return host.popen(cmd + (["--broker-host", broker] if broker else []), log)


def _start(hosts: dict[str, list[Host]], stacks: dict[str, Path], job: Path, ranks: int) -> dict[str, subprocess.Popen[bytes]]:
    procs = {}
    for c in CLUSTERS:
        for r in range(ranks):
            broker = "" if r == 0 else hosts[c][0].hostname
            procs[hosts[c][r].hostname] = _up(hosts[c][r], job, c, r, stacks[c],
                                              job.parent / f"{job.stem}-{hosts[c][r].hostname}.log", broker)
    return procs


def _finish(procs: dict[str, subprocess.Popen[bytes]], job: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    for host, proc in procs.items():
        try:
            code = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(10)
        log = (job.parent / f"{job.stem}-{host}.log").read_text()[-3000:]
        assert code == 0, f"{host}: `up` exited {code}:\n{log}"


def _status(run_dir: Path, worker: str) -> dict[str, int]:
    try:
        return json.loads((run_dir / "status" / f"{worker}.json").read_text())
    except (OSError, ValueError):
        return {}


def test_four_hosts_one_command_each_and_a_killed_remote_rank_ends_bit_identical(tmp_path: Path) -> None:
    copy_split_example(tmp_path)
    with cluster_broker_hosts("fh", NAMES, tmp_path) as (hosts, stacks):
        single = _job(tmp_path, "single", ranks=1)
        _finish(_start(hosts, stacks, single, ranks=1), single)
        clean = _job(tmp_path, "clean", ranks=2)
        a1, b1 = hosts["cluster-a"][0], hosts["cluster-b"][0]
        wan_sent = a1.tx_bytes()
        _finish(_start(hosts, stacks, clean, ranks=2), clean)
        # Both head ranks' messages crossed the WAN link from a1, federated by b1's broker, which
        # reaches a1's by its name over TLS checked against that name (SNI).
        published = sum(_metric(tmp_path / "clean-cluster-a" / "metrics" / f"{w}.prom", "nebula_wire_bytes_total",
                                direction="out") for w in ("head-0", "head-0-r1"))
        assert published > 10_000 and a1.tx_bytes() - wan_sent >= published, published
        params = json.loads(b1.nebula("provision", str(clean), "--cluster", "cluster-b", "--dry-run").stdout)["parameters"]
        uri = params[0]["value"]["uri"]
        assert f"amqps://{a1.hostname}:{PORT}/" in uri and f"server_name_indication={a1.hostname}" in uri, uri
        assert f"{b1.address}:" in a1.run("ss", "-tnH", "state", "established", f"( sport = :{PORT} )").stdout
        for c in CLUSTERS:  # either broker host sees every worker of every host of both clusters
            out = hosts[c][0].nebula("status", str(clean), "--stack", str(stacks[c]), "--feed", c, "--json")
            rows = {r["worker"]: r for r in json.loads(out.stdout)["workers"]}
            assert set(rows) == set(WORKERS), (c, rows)
            assert all(r["state"] == "finished" and r["step"] == STEPS for r in rows.values()), (c, rows)
            assert {w: r["cluster"] for w, r in rows.items()} == {w: _cluster(w) for w in WORKERS}, rows

        killed = _job(tmp_path, "killed", ranks=2)
        procs = _start(hosts, stacks, killed, ranks=2)
        run_a = tmp_path / "killed-cluster-a"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and int(_status(run_a, "head-0-r1").get("step", 0)) < 5:
            time.sleep(0.1)
        victim = _status(run_a, "head-0-r1")
        assert int(victim.get("step", 0)) >= 5, victim
        os.kill(int(victim["pid"]), signal.SIGKILL)  # head rank 1, on a2: not the broker's host
        _finish(procs, killed)
        log_a2 = (tmp_path / "killed-a2.nebula.test.log").read_text()
        assert "head-0-r1" in log_a2 and "restart" in log_a2, log_a2[-3000:]

    for worker in WORKERS:
        c_ck = final_checkpoint(tmp_path / f"clean-{_cluster(worker)}", worker)
        k_ck = final_checkpoint(tmp_path / f"killed-{_cluster(worker)}", worker)
        assert c_ck.step == k_ck.step == STEPS and c_ck.digest == k_ck.digest, worker
    # 2x2 trains the 1x1 model (to float tolerance), and the ranks of a side hold the same weights.
    for cluster, worker in (("cluster-a", "head-0"), ("cluster-b", "tail-0")):
        one = final_checkpoint(tmp_path / f"single-{cluster}", worker).arrays
        two = [final_checkpoint(tmp_path / f"clean-{cluster}", w).arrays for w in (worker, f"{worker}-r1")]
        weights = [k for k in one if "/param/" in k]
        assert weights, one.keys()
        for k in weights:
            assert np.array_equal(two[0][k], two[1][k]), (worker, k)
            np.testing.assert_allclose(two[0][k], one[k], rtol=2e-4, atol=2e-5, err_msg=k)
    # The key crossed over the brokers, sealed; each cluster's second host took it from the shared run dir.
    keys = [(tmp_path / f"killed-{c}" / "keys" / "job.key").read_bytes() for c in CLUSTERS]
    assert keys[0] == keys[1]
    assert "received sealed from cluster-a" in (tmp_path / "killed-b1.nebula.test.log").read_text()
    assert "from b1.nebula.test's `up`" in (tmp_path / "killed-b2.nebula.test.log").read_text()
