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


STEPS = 24


@pytest.fixture(scope="module")
def clean_run(stack, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """One uninterrupted run: the reference every faulted run must reproduce bit for bit."""
    tmp = tmp_path_factory.mktemp("clean")
    cfg, _ = write_job(stack, tmp, "clean", STEPS)
    procs = [start("abnet-decoder", cfg, tmp / "dec.log"), start("abnet-encoder", cfg, tmp / "enc.log")]
    wait(procs, 240)
    assert [p.returncode for p in procs] == [0, 0], (tmp / "dec.log").read_text()[-3000:]
    return tmp / "clean"


def test_abnet_across_tls_federation_trains(clean_run: Path) -> None:
    assert step_of(clean_run, "enc-0") == step_of(clean_run, "dec-0") == STEPS
    losses = [json.loads(line)["loss"] for line in (clean_run / "history" / "dec-0.jsonl").read_text().splitlines()]
    assert len(losses) == STEPS
    assert sum(losses[-6:]) / 6 < sum(losses[:6]) / 6 - 0.2  # replies flow back and training works
    # Both sides saw the same losses: every reply reached the encoder, in order.
    enc = [json.loads(line)["loss"] for line in (clean_run / "history" / "enc-0.jsonl").read_text().splitlines()]
    assert enc == losses


def _run_until(run_dir: Path, worker: str, step: int) -> None:
    deadline = time.monotonic() + 120
    while step_of(run_dir, worker) < step and time.monotonic() < deadline:
        time.sleep(0.05)
    assert step_of(run_dir, worker) >= step


def test_kill9_of_the_decoder_replays_and_ends_bit_identical(stack, tmp_path: Path, clean_run: Path) -> None:  # type: ignore[no-untyped-def]
    cfg, _ = write_job(stack, tmp_path, "chaos", STEPS)
    run2 = tmp_path / "chaos"
    dec = start("abnet-decoder", cfg, tmp_path / "dec.log")
    enc = start("abnet-encoder", cfg, tmp_path / "enc.log")
    _run_until(run2, "dec-0", 6)
    os.kill(dec.pid, signal.SIGKILL)
    dec.wait()
    dec = start("abnet-decoder", cfg, tmp_path / "dec.log")
    wait([enc, dec], 240)
    assert (enc.returncode, dec.returncode) == (0, 0), (tmp_path / "dec.log").read_text()[-3000:]
    for worker in ("enc-0", "dec-0"):
        assert final(run2, worker).step == STEPS
        assert final(run2, worker).digest == final(clean_run, worker).digest, worker


def test_daemon_lifecycle_sigterm_restart_resume(stack, tmp_path: Path, clean_run: Path) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM: finish the micro-batch in flight, checkpoint, ack, exit 0; a restart
    resumes at the checkpointed step and the job ends as if never stopped."""
    cfg, _ = write_job(stack, tmp_path, "life", STEPS)
    run3 = tmp_path / "life"
    dec = start("abnet-decoder", cfg, tmp_path / "dec.log")
    enc = start("abnet-encoder", cfg, tmp_path / "enc.log")
    _run_until(run3, "enc-0", 8)
    enc.send_signal(signal.SIGTERM)
    dec.send_signal(signal.SIGTERM)
    wait([enc, dec], 60)
    assert (enc.returncode, dec.returncode) == (0, 0)
    stopped = {}
    for worker in ("enc-0", "dec-0"):
        status = json.loads((run3 / "status" / f"{worker}.json").read_text())
        assert status["state"] == "stopped"
        assert 8 <= status["step"] < STEPS
        assert final(run3, worker).step == status["step"]  # checkpointed where it stopped
        stopped[worker] = status["step"]
    dec = start("abnet-decoder", cfg, tmp_path / "dec.log")
    enc = start("abnet-encoder", cfg, tmp_path / "enc.log")
    wait([enc, dec], 240)
    assert (enc.returncode, dec.returncode) == (0, 0)
    log = (tmp_path / "enc.log").read_text()
    assert f'"step": {stopped["enc-0"]}' in log and '"resumed"' in log
    for worker in ("enc-0", "dec-0"):
        assert final(run3, worker).step == STEPS
        assert final(run3, worker).digest == final(clean_run, worker).digest, worker
