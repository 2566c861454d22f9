"""ABNet end to end on real brokers: encoder on cluster-a, decoder on cluster-b,
activations and gradients crossing TLS federation through the WAN relay.

Workers run as separate ``nebula-mq worker`` processes configured from a job
file that names their brokers, as in a real deployment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.security.keys import ensure_job_key, job_key_file
from nebula_mq.settings import load_settings
from workers.plans import plan_for

pytestmark = [pytest.mark.broker, pytest.mark.paddle]

JOB = """
[job]
id = "{job_id}"
scenario = "abnet"
seed = 11
steps = {steps}
run_dir = "{run_dir}"

[codec]
forward = "fp16(svd(0.6))"
backward = "int8"

[abnet]
preset = "tiny"
batch_size = 16
in_flight = 3
lr = 0.01
checkpoint_every = 4
src_cluster = "cluster-a"
tgt_cluster = "cluster-b"
"""


def write_job(stack, tmp: Path, name: str, steps: int) -> tuple[Path, object]:  # type: ignore[no-untyped-def]
    """Provision a job on the test stack and write its TOML with each cluster's broker."""
    text = JOB.format(job_id="placeholder", steps=steps, run_dir=tmp / name)
    probe = tmp / f"{name}-probe.toml"
    probe.write_text(text)
    plan = plan_for(load_settings(probe, environ={}))
    job = stack.new_job(flows=plan.flows, identities={})
    text = text.replace('"placeholder"', f'"{job.job_id}"')
    identities = plan.identities(job.job_id)
    stack.stack.provision_job(job.job_id, plan.flows, identities)
    for proc in plan.processes:
        b = stack.broker_settings(proc.cluster, proc.identity(job.job_id), vhost=job.vhost)
        text += (f'\n[clusters.{proc.cluster}.broker]\nhost = "{b.host}"\nport = {b.port}\n'
                 f'vhost = "{b.vhost}"\nca_file = "{b.ca_file}"\ncert_file = "{b.cert_file}"\n'
                 f'key_file = "{b.key_file}"\nserver_name = "{b.server_name}"\nheartbeat_s = 10\n')
    path = tmp / f"{name}.toml"
    path.write_text(text)
    # The job's HMAC key exists before either side starts (as `nebula-mq run` does).
    ensure_job_key(job_key_file(tmp / name), job.job_id)
    return path, job


def start(role: str, config: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "nebula_mq", "worker", "--role", role, "--config", str(config)]
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def step_of(run_dir: Path, worker: str) -> int:
    try:
        return int(json.loads((run_dir / "status" / f"{worker}.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def wait(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        p.wait(max(1.0, deadline - time.monotonic()))


def final(run_dir: Path, worker: str):  # type: ignore[no-untyped-def]
    ck = CheckpointStore(run_dir / "checkpoints" / worker).latest()
    assert ck is not None
    return ck


def test_abnet_across_tls_federation_trains_and_survives_kill9(stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    steps = 24
    clean_cfg, _ = write_job(stack, tmp_path, "clean", steps)
    run_dir = tmp_path / "clean"
    procs = [start("abnet-decoder", clean_cfg, tmp_path / "clean-dec.log"),
             start("abnet-encoder", clean_cfg, tmp_path / "clean-enc.log")]
    wait(procs, 240)
    assert [p.returncode for p in procs] == [0, 0], (tmp_path / "clean-dec.log").read_text()[-3000:]
    assert step_of(run_dir, "enc-0") == step_of(run_dir, "dec-0") == steps
    losses = [json.loads(line)["loss"] for line in (run_dir / "history" / "dec-0.jsonl").read_text().splitlines()]
    assert len(losses) == steps
    assert sum(losses[-6:]) / 6 < sum(losses[:6]) / 6 - 0.2  # replies flow back and training works

    # Same job again, with the decoder killed -9 mid-run and restarted: the queues
    # replay what it had not checkpointed, and the end state is bit-identical.
    cfg, _ = write_job(stack, tmp_path, "chaos", steps)
    run2 = tmp_path / "chaos"
    dec = start("abnet-decoder", cfg, tmp_path / "chaos-dec.log")
    enc = start("abnet-encoder", cfg, tmp_path / "chaos-enc.log")
    deadline = time.monotonic() + 120
    while step_of(run2, "dec-0") < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert step_of(run2, "dec-0") >= 6
    os.kill(dec.pid, signal.SIGKILL)
    dec.wait()
    dec = start("abnet-decoder", cfg, tmp_path / "chaos-dec.log")
    wait([enc, dec], 240)
    assert (enc.returncode, dec.returncode) == (0, 0), (tmp_path / "chaos-dec.log").read_text()[-3000:]
    for worker in ("enc-0", "dec-0"):
        assert final(run2, worker).step == steps
        assert final(run2, worker).digest == final(run_dir, worker).digest, worker
