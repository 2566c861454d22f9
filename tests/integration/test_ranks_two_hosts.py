"""One side's ranks on two hosts of its cluster (issue 28): the head group of a split job spans
host a, which runs the cluster's broker, and host b, which reaches it over the kernel-shaped
link between their network namespaces. Each rank is started on its own host as a user would
(``nebula-mq worker --index``); the group meets at ``head_hosts[0]``, gloo binds to the
interface holding each rank's address, and the job ends bit-identical to the same job with
both ranks on one host. A rank started on a host that is not its own is refused in one line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from nebula_mq import topology
from tests.fixtures.jobs import copy_split_example, final_checkpoint, split_job, wait_all
from tests.fixtures.lanes import CPU_HEAVY
from tests.fixtures.netns import Host, popen, two_hosts

pytestmark = [pytest.mark.broker, pytest.mark.paddle, CPU_HEAVY]

CLUSTER = "cluster-a"
PORT = 5671  # the broker's AMQPS port on host a
GLOO_PORT = 29200  # each host has its own port space: the default ports are free there
WORKERS = ("head-0", "head-0-r1", "tail-0")


def _job(tmp: Path, name: str, broker: Host, head_hosts: tuple[str, str], stack: Path, model: str) -> dict[str, Path]:
    """The job file of run ``name`` and one file per worker with its broker identity."""
    job_id = f"{name}{os.getpid()}"
    hosts = ", ".join(f'"{h}"' for h in head_hosts)
    extra = (f'head_ranks = 2\nhead_hosts = [{hosts}]\nhead_gloo_port = {GLOO_PORT}\ngroup_timeout_s = 60\n')
    text = split_job(job_id, tmp / name, steps=12, head=model, tail=model, forward="none", backward="none", in_flight=1,
                     checkpoint_every=4, extra=extra).replace('tail_cluster = "cluster-b"', f'tail_cluster = "{CLUSTER}"')
    files = {"job": tmp / f"{name}.toml"}
    files["job"].write_text(text)
    cert_dir = stack / "certs" / CLUSTER
    for worker in WORKERS:
        ident = cert_dir / "clients" / f"{job_id}.{worker}"
        files[worker] = tmp / f"{name}-{worker}.toml"
        files[worker].write_text(text + (
            f'\n[clusters.{CLUSTER}.broker]\nhost = "{broker.hostname}"\nport = {PORT}\n'
            f'vhost = "{topology.vhost(job_id)}"\nca_file = "{cert_dir / "trust.pem"}"\n'
            f'cert_file = "{ident / "cert.pem"}"\nkey_file = "{ident / "key.pem"}"\n'
            f'server_name = "{broker.hostname}"\nheartbeat_s = 10\n'))
    return files


def _worker(host: Host, files: dict[str, Path], worker: str, tmp: Path, name: str):  # type: ignore[no-untyped-def]
    role, index = ("split-tail", 0) if worker == "tail-0" else ("split-head", 0 if worker == "head-0" else 1)
    return popen(host, [sys.executable, "-m", "nebula_mq", "worker", "--role", role, "--index", str(index),
                        "--config", str(files[worker])], tmp / f"{name}-{worker}.log")


def _train(a: Host, tmp: Path, name: str, rank1_on: Host, stack: Path, model: str) -> Path:
    files = _job(tmp, name, a, (a.hostname, rank1_on.hostname), stack, model)
    out = a.nebula("provision", str(files["job"]), "--cluster", CLUSTER, "--stack", str(stack))
    assert f"provisioned on {CLUSTER}" in out.stdout
    places = {"head-0": a, "head-0-r1": rank1_on, "tail-0": a}
    procs = {w: _worker(places[w], files, w, tmp, name) for w in WORKERS}
    wait_all(procs, tmp, name, timeout=240)
    return tmp / name


def test_a_side_on_two_hosts_trains_as_it_does_on_one(tmp_path: Path) -> None:
    """torch.distributed's group (the example's torch model) on one pair of hosts and one
    broker; paddle's gloo group across hosts is test_four_hosts.py's 2x2 job."""
    copy_split_example(tmp_path)
    runs: dict[str, tuple[Path, Path, int]] = {}
    with two_hosts("rk", ("rank-a.nebula.test", "rank-b.nebula.test")) as (a, b):
        stack = tmp_path / "stack"
        try:
            a.nebula("stack", "up", "--stack", str(stack), "--clusters", CLUSTER, "--listen", a.address,
                     "--hostname", a.hostname, "--base-port", str(PORT), "--prefix", f"rk{os.getpid()}")
            for framework, model in (("torch", "mlp_torch"),):
                sent_before = b.tx_bytes()
                apart = _train(a, tmp_path, f"apart{framework}", b, stack, model)
                sent_by_b = b.tx_bytes() - sent_before
                together = _train(a, tmp_path, f"together{framework}", a, stack, model)
                runs[model] = (apart, together, sent_by_b)

            # A rank started on the wrong host is refused before it joins, in one line.
            files = _job(tmp_path, "wrong", a, (a.hostname, b.hostname), stack, "mlp")
            wrong = b.run(sys.executable, "-m", "nebula_mq", "worker", "--role", "split-head", "--index", "0",
                          "--config", str(files["head-0"]), check=False)
        finally:
            if (stack / "stack.json").exists():
                a.nebula("stack", "down", "--stack", str(stack), check=False)

    for model, (apart, together, sent_by_b) in runs.items():
        _same_training(apart, together, sent_by_b, model)
    assert wrong.returncode != 0
    last = wrong.stderr.strip().splitlines()[-1]
    assert "head-0 (cluster-a) is placed on rank-a.nebula.test" in last and "which is not this host" in last \
        and "Traceback" not in wrong.stderr, wrong.stderr


def _same_training(apart: Path, together: Path, sent_by_b: int, model: str) -> None:
    for worker in WORKERS:
        ck_apart, ck_together = final_checkpoint(apart, worker), final_checkpoint(together, worker)
        assert ck_apart.step == ck_together.step == 12, (model, worker)
        assert ck_apart.digest == ck_together.digest, (model, worker)  # the same arithmetic, wherever ranks run
    heads = [final_checkpoint(apart, w).arrays for w in ("head-0", "head-0-r1")]
    weights = [k for k in heads[0] if "/param/" in k]
    assert weights and all(np.array_equal(heads[0][k], heads[1][k]) for k in weights), model
    # Rank 1's gradients and its broker traffic left host b over the link.
    assert sent_by_b > 50_000, (model, sent_by_b)
