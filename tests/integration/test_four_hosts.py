"""Two clusters of two hosts each, set up and run as the deployment guide's short way writes it,
command by command (docs/deployment.md; ``tests.fixtures.netns.short_way`` reads it): each
cluster's first host runs its broker (the only node on the WAN link, shaped by ``tc tbf``) and
trusts the other's with the line the other's ``stack up`` printed; the second reaches it over the
cluster's unshaped LAN. A 2x2 split job runs every rank on a host of its own, each host started
with one command: ``nebula-mq up JOB --cluster C --ranks I`` (``--broker-host`` on a host without
the broker; the hosts of a cluster share a filesystem, the clusters share nothing: the job key
and the job file cross over the brokers, sealed). Federation runs by the broker hosts' names, over TLS checked
against them, and the activations cross the shaped link. A SIGKILL of the remote rank mid-run is
repaired by the supervisors of both its group's hosts (the rank on the broker's host leaves at
its next all-reduce), and the job ends bit-identical to an uninterrupted one, which itself
trains the same model as the 1x1 job. (A SIGTERM or Ctrl-C to ``up`` is ``run``'s stop, the
same supervisor: ``test_stack_cli.py`` stops and resumes it.)

A replicas job (issue 31) on the same four hosts (``[replicas.hosts]``): each cluster's replica
is a gloo group of a rank on the broker's host and one on the cluster's second host. Rank 0 of
each cluster exchanges pseudo-gradients across the shaped link; rank 1 takes every event's
average from its own broker. Every rank of both clusters ends on the same outer weights, and a
SIGKILL of cluster-b's rank on its second host ends bit-identical to the clean run. The two
jobs share the hosts and their brokers (half a minute to set up, and as long to take down)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.jobs import final_checkpoint, split_job, wait_steps, worker_status
from tests.fixtures.lanes import CPU_HEAVY
from tests.fixtures.netns import CLUSTERS, PORT, Host, cluster_broker_hosts, popen, short_way
from tests.fixtures.pairs import SPLIT_EXAMPLE
from tests.fixtures.replicas import job_text
from tests.fixtures.up import finish_ups, log_of, place_job, run_dir, up_every_host

pytestmark = [pytest.mark.broker, pytest.mark.paddle, CPU_HEAVY]

# The hosts as the deployment guide names them (each namespace's /etc/hosts knows them).
NAMES = (("a1.example.org", "a2.example.org"), ("b1.example.org", "b2.example.org"))
WORKERS = ("head-0", "head-0-r1", "tail-0", "tail-0-r1")
STEPS = 16
Hosts = tuple[dict[str, list[Host]], dict[str, Path]]


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    """Each cluster's hosts, its broker trusted by the other's, and its data centre's folder
    (``cluster_broker_hosts``), with the example's modules beside the job files to come."""
    with cluster_broker_hosts("fh", NAMES, tmp_path_factory.mktemp("four-hosts")) as (hosts, dcs):
        for folder in dcs.values():
            for name in ("mlp.py", "mlp_torch.py", "mlp_data.py", "mlp_replicas.py"):
                shutil.copy(SPLIT_EXAMPLE / name, folder)
        yield hosts, dcs


def test_the_short_way_is_three_commands_on_a_broker_host_and_one_on_each_other_host() -> None:
    commands: dict[str, list[str]] = {}
    for prompt, args in short_way():
        commands.setdefault(prompt, []).append(" ".join(args[:2]))
    assert commands == {"A1": ["stack up", "stack trust", "up job.toml"], "B1": ["stack up", "stack trust", "up job.toml"],
                        "A2": ["up job.toml"], "B2": ["up job.toml"]}, commands


def federation(text: str) -> str:
    """``text`` with each cluster's broker named by its host (``[clusters.<c>.federation]``)."""
    for c, names in zip(CLUSTERS, NAMES):
        text += f'\n[clusters.{c}.federation]\nhost = "{names[0]}"\nport = {PORT}\n'
    return text


def _metric(path: Path, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(path.read_text()) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _cluster(worker: str) -> str:
    return "cluster-a" if worker.startswith("head") else "cluster-b"


def _job(dcs: dict[str, Path], name: str, ranks: int) -> str:
    a, b = NAMES
    extra = "group_timeout_s = 30\n" + ("" if ranks == 1 else
                                         f'head_ranks = 2\nhead_hosts = ["{a[0]}", "{a[1]}"]\n'
                                         f'tail_ranks = 2\ntail_hosts = ["{b[0]}", "{b[1]}"]\n')
    text = split_job(f"{name}{os.getpid()}", Path(name), steps=STEPS, forward="none", backward="none", in_flight=1,
                     checkpoint_every=4, extra=extra)
    return place_job(dcs, name, federation(text))


def test_four_hosts_one_command_each_and_a_killed_remote_rank_ends_bit_identical(four_hosts: Hosts) -> None:
    hosts, dcs = four_hosts
    single = _job(dcs, "single", ranks=1)
    finish_ups(up_every_host(hosts, dcs, single, ranks=1), dcs, single)
    clean = _job(dcs, "clean", ranks=2)
    a1, b1 = hosts["cluster-a"][0], hosts["cluster-b"][0]
    wan_sent = a1.tx_bytes()
    finish_ups(up_every_host(hosts, dcs, clean, ranks=2), dcs, clean)
    # Both head ranks' messages crossed the WAN link from a1, federated by b1's broker, which
    # reaches a1's by its name over TLS checked against that name (SNI).
    published = sum(_metric(run_dir(dcs, clean, "cluster-a") / "metrics" / f"{w}.prom", "nebula_wire_bytes_total",
                            direction="out") for w in ("head-0", "head-0-r1"))
    assert published > 10_000 and a1.tx_bytes() - wan_sent >= published, published
    params = json.loads(b1.nebula("provision", clean, "--cluster", "cluster-b", "--dry-run",
                                  cwd=dcs["cluster-b"]).stdout)["parameters"]
    uri = params[0]["value"]["uri"]
    assert f"amqps://{a1.hostname}:{PORT}/" in uri and f"server_name_indication={a1.hostname}" in uri, uri
    assert f"{b1.address}:" in a1.run("ss", "-tnH", "state", "established", f"( sport = :{PORT} )").stdout
    for c in CLUSTERS:  # either broker host sees every worker of every host of both clusters, and its links up
        out = hosts[c][0].nebula("status", clean, "--feed", c, "--json", cwd=dcs[c])
        body = json.loads(out.stdout)
        rows = {r["worker"]: r for r in body["workers"]}
        assert set(rows) == set(WORKERS), (c, rows)
        assert all(r["state"] == "finished" and r["step"] == STEPS for r in rows.values()), (c, rows)
        assert {w: r["cluster"] for w, r in rows.items()} == {w: _cluster(w) for w in WORKERS}, rows
        peer = next(p for p in CLUSTERS if p != c)
        assert any(line.startswith(f"link from {peer} to {c} (") and line.endswith(": up") for line in body["links"]), body

    killed = _job(dcs, "killed", ranks=2)
    procs = up_every_host(hosts, dcs, killed, ranks=2)
    run_a = run_dir(dcs, killed, "cluster-a")
    wait_steps(run_a, 5, ["head-0-r1"], timeout=180)
    victim = worker_status(run_a, "head-0-r1")
    os.kill(int(victim["pid"]), signal.SIGKILL)  # head rank 1, on a2: not the broker's host
    finish_ups(procs, dcs, killed)
    log_a2 = log_of(dcs, killed, "a2.example.org").read_text()
    assert "head-0-r1" in log_a2 and "restart" in log_a2, log_a2[-3000:]

    for worker in WORKERS:
        c_ck = final_checkpoint(run_dir(dcs, clean, _cluster(worker)), worker)
        k_ck = final_checkpoint(run_dir(dcs, killed, _cluster(worker)), worker)
        assert c_ck.step == k_ck.step == STEPS and c_ck.digest == k_ck.digest, worker
    # 2x2 trains the 1x1 model (to float tolerance), and the ranks of a side hold the same weights.
    for cluster, worker in (("cluster-a", "head-0"), ("cluster-b", "tail-0")):
        one = final_checkpoint(run_dir(dcs, single, cluster), worker).arrays
        two = [final_checkpoint(run_dir(dcs, clean, cluster), w).arrays for w in (worker, f"{worker}-r1")]
        weights = [k for k in one if "/param/" in k]
        assert weights, one.keys()
        for k in weights:
            assert np.array_equal(two[0][k], two[1][k]), (worker, k)
            np.testing.assert_allclose(two[0][k], one[k], rtol=2e-4, atol=2e-5, err_msg=k)
    # The key crossed over the brokers, sealed; each cluster's second host took it from the shared run dir.
    keys = [(run_dir(dcs, killed, c) / "keys" / "job.key").read_bytes() for c in CLUSTERS]
    assert keys[0] == keys[1]
    assert "received sealed from cluster-a, with its job file" in log_of(dcs, killed, "b1.example.org").read_text()
    assert "from b1.example.org's `up`" in log_of(dcs, killed, "b2.example.org").read_text()


def test_a_job_file_edited_on_one_side_only_is_refused_in_one_line_naming_what_differs(four_hosts: Hosts) -> None:
    """The job file crosses with the key: B's `up` compares it with its own copy; what each side keeps
    in its own place (its paths) may differ, anything else may not."""
    hosts, dcs = four_hosts
    job = _job(dcs, "edited", ranks=1)
    b_copy = dcs["cluster-b"] / job
    b_copy.write_text(b_copy.read_text().replace("lr = 0.003", "lr = 0.001")
                      .replace('run_dir = "edited"', 'run_dir = "edited-here"'))
    procs = up_every_host(hosts, dcs, job, ranks=1)
    try:
        assert procs["b1.example.org"].wait(120) == 1
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(150)
    console = log_of(dcs, job, "b1.example.org").read_text()
    errors = [line for line in console.splitlines() if line.startswith("nebula-mq: error:")]
    assert len(errors) == 1 and "Traceback" not in console, console[-3000:]
    assert f"nebula-mq: error: {job}: split.lr: expected the job cluster-a runs" in errors[0], errors[0]
    assert "split.lr = 0.001 here, 0.003 on cluster-a" in errors[0] and "run_dir" not in errors[0], errors[0]
    theirs = dcs["cluster-b"] / "edited-here.cluster-a.toml"
    assert theirs.read_text() == (dcs["cluster-a"] / job).read_text()  # cluster-a's copy, to read or take
    assert not (dcs["cluster-b"] / "edited-here" / "status").exists()  # no worker of B started


REPLICAS = {"cluster-a": ("replica-0", "replica-0-r1"), "cluster-b": ("replica-1", "replica-1-r1")}
REPLICAS_STEPS = 8  # sync events
GLOO_PORT = 29400  # each host has its own port space: the default ports are free there
def _replicas_job(dcs: dict[str, Path], name: str) -> str:
    a, b = NAMES
    text = job_text(f"{name}{os.getpid()}", name, REPLICAS_STEPS, codec="int8", checkpoint_every=3, ranks=2,
                    gloo_port=GLOO_PORT, group_timeout_s=30,
                    hosts={"cluster-a": [a[0], a[1]], "cluster-b": [b[0], b[1]]})
    return place_job(dcs, name, federation(text))


def _outer(dcs: dict[str, Path], job: str, cluster: str, worker: str) -> dict[str, np.ndarray]:
    arrays = final_checkpoint(run_dir(dcs, job, cluster), worker).arrays
    return {k: np.asarray(v) for k, v in arrays.items() if k.startswith("outer/param/")}


def test_replica_ranks_on_four_hosts_one_command_each_and_a_killed_remote_rank(four_hosts: Hosts) -> None:
    hosts, dcs = four_hosts
    clean = _replicas_job(dcs, "rclean")
    finish_ups(up_every_host(hosts, dcs, clean, ranks=2), dcs, clean)
    for c, (a_host, b_host) in zip(CLUSTERS, NAMES):  # each host's `up` started its own rank
        for r, host in enumerate((a_host, b_host)):
            log = log_of(dcs, clean, host).read_text()
            assert f"{REPLICAS[c][r]}: exit 0" in log and REPLICAS[c][1 - r] + ":" not in log, log[-2000:]
    for c in CLUSTERS:  # either broker host sees every rank of both clusters finished
        out = hosts[c][0].nebula("status", clean, "--feed", c, "--json", cwd=dcs[c])
        rows = {r["worker"]: r for r in json.loads(out.stdout)["workers"]}
        assert set(rows) == {w for ws in REPLICAS.values() for w in ws}, (c, rows)
        assert all(r["state"] == "finished" and r["step"] == REPLICAS_STEPS for r in rows.values()), (c, rows)
    killed = _replicas_job(dcs, "rkilled")
    procs = up_every_host(hosts, dcs, killed, ranks=2)
    run_b = run_dir(dcs, killed, "cluster-b")
    wait_steps(run_b, 3, ["replica-1-r1"], timeout=180)
    victim = worker_status(run_b, "replica-1-r1")
    os.kill(int(victim["pid"]), signal.SIGKILL)  # cluster-b's rank 1, on b2: not the broker's host
    finish_ups(procs, dcs, killed)
    log_b2 = log_of(dcs, killed, "b2.example.org").read_text()
    assert "replica-1-r1" in log_b2 and "restart" in log_b2, log_b2[-3000:]

    for cluster, workers in REPLICAS.items():
        for worker in workers:
            c_ck = final_checkpoint(run_dir(dcs, clean, cluster), worker)
            k_ck = final_checkpoint(run_dir(dcs, killed, cluster), worker)
            assert c_ck.step == k_ck.step == REPLICAS_STEPS and c_ck.digest == k_ck.digest, worker
    # Every rank of both clusters holds the same outer weights, bit for bit.
    first = _outer(dcs, clean, "cluster-a", "replica-0")
    assert first
    for cluster, workers in REPLICAS.items():
        for worker in workers:
            other = _outer(dcs, clean, cluster, worker)
            assert other.keys() == first.keys()
            for k in first:
                np.testing.assert_array_equal(other[k], first[k], err_msg=f"{worker} {k}")


# A researcher's own model and scripts (not the project's examples): a linear head, a small tail.
OWN_MODEL = '''
import numpy as np
import torch

X = np.random.default_rng(3).normal(size=(256, 8)).astype(np.float32)
Y = (X @ np.arange(1, 9, dtype=np.float32)[:, None] / 10).astype(np.float32)


def ids(mb):
    return np.arange(mb * 16, mb * 16 + 16) % len(X)


def head():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 12)


def tail():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(12, 1))
'''
OWN_HEAD = '''import sys
from mine import X, head, ids
from workers.split import run_head
sys.exit(run_head(sys.argv[1], model=head(), inputs=lambda mb: (ids(mb), X[ids(mb)])))
'''
OWN_TAIL = '''import sys
import torch
from mine import Y, tail
from workers.split import run_tail
sys.exit(run_tail(sys.argv[1], model=tail(), loss=torch.nn.functional.mse_loss, targets=lambda i: Y[i]))
'''


def test_a_users_own_scripts_run_as_the_two_sides_with_no_broker_table_and_no_certificate_path(
        four_hosts: Hosts) -> None:
    """``python head.py job.toml`` on a1 and ``python tail.py job.toml`` on b1, each in its data
    centre's folder: the scripts take the broker from the host's stack as ``up`` does, the head's
    side provisions and sends the key and job file, the tail's takes them."""
    hosts, dcs = four_hosts
    text = federation(f'[job]\nid = "own{os.getpid()}"\nscenario = "split"\nsteps = 24\nrun_dir = "own"\n'
                      f'device = "cpu"\n\n[split]\nhead_cluster = "cluster-a"\ntail_cluster = "cluster-b"\n'
                      f'in_flight = 2\ncheckpoint_every = 8\n')
    job = place_job(dcs, "own", text)
    for folder in dcs.values():
        for name, body in (("mine.py", OWN_MODEL), ("head.py", OWN_HEAD), ("tail.py", OWN_TAIL)):
            (folder / name).write_text(body)
    env = ["env", f"PYTHONPATH={Path(__file__).resolve().parents[2]}"]
    procs = {c: popen(hosts[c][0], [*env, sys.executable, script, job], log_of(dcs, job, hosts[c][0].hostname),
                      cwd=dcs[c])
             for c, script in (("cluster-b", "tail.py"), ("cluster-a", "head.py"))}
    try:
        codes = {c: p.wait(240) for c, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    logs = {c: log_of(dcs, job, hosts[c][0].hostname).read_text() for c in CLUSTERS}
    assert codes == {"cluster-a": 0, "cluster-b": 0}, {c: t[-2500:] for c, t in logs.items()}
    assert "received sealed from cluster-a, with its job file" in logs["cluster-b"], logs["cluster-b"][-2500:]
    losses = [json.loads(line)["loss"] for line in (run_dir(dcs, job, "cluster-b") / "history" / "tail-0.jsonl")
              .read_text().splitlines()]
    assert len(losses) == 24 and losses[-1] < losses[0], losses
