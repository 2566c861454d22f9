"""What the console of ``nebula-mq run`` says when a worker stops, and what ``status`` says after:
the worker's one-line reason and its log, never a traceback; a mistake of the job's own is not
restarted; nothing is lost (the same command, once the mistake is fixed, finishes the job with
every step applied once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.jobs import copy_split_example, split_job
from tests.fixtures.stack import StackHandle
from tests.fixtures.threads import history

pytestmark = pytest.mark.broker

# A user's tail with a bug: while the file ``broken`` sits beside it, its forward cuts the
# activation to 7 of its 32 features.
FAULTY_TAIL = '''
from pathlib import Path

from torch import nn

from mlp_data import dataset
from mlp_torch import top

BROKEN = Path(__file__).with_name("broken")


class Tail(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = top()

    def forward(self, x):
        return self.net(x[:, :7] if BROKEN.exists() else x)


def build_tail(settings):
    from workers.split import TailSpec

    _, y = dataset()
    return TailSpec(model=Tail(), loss=nn.functional.mse_loss, targets=lambda ids: y[ids])
'''


def nebula(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """A ``nebula-mq`` command as a user types it (no ``NEBULA__`` override from the test's environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEBULA__")}
    return subprocess.run([sys.executable, "-m", "nebula_mq", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_a_model_that_raises_is_one_line_on_the_console_not_restarted_and_loses_nothing(
        stack: StackHandle, tmp_path: Path) -> None:
    copy_split_example(tmp_path)
    (tmp_path / "faulty.py").write_text(FAULTY_TAIL)
    (tmp_path / "broken").touch()
    run_dir, job = tmp_path / "run", tmp_path / "job.toml"
    job.write_text(split_job(f"reason-{os.getpid()}", run_dir, steps=30, head="mlp_torch", tail="faulty"))

    run = nebula("run", str(job), "--stack", stack.run_dir)
    console = run.stdout + run.stderr
    assert run.returncode == 1, console[-3000:]
    line = ("tail-0 (cluster-b): the model's forward on micro-batch 0 raised RuntimeError: "
            "mat1 and mat2 shapes cannot be multiplied (32x7 and 32x32)")
    assert line in console, console[-3000:]
    assert f"log: {run_dir / 'logs' / 'tail-0.log'}" in console
    assert "not restarting tail-0" in console and "restarting tail-0 in" not in console, console[-3000:]
    assert "Traceback" not in console
    # The whole trace is in the worker's log, where the console's line points.
    records = [json.loads(r) for r in (run_dir / "logs" / "tail-0.log").read_text().splitlines()]
    raised = [r for r in records if r.get("event") == "user_code_raised"]
    assert raised and "Traceback" in raised[0]["exception"] and "faulty.py" in raised[0]["exception"]

    status = nebula("status", str(job), "--stack", stack.run_dir)
    assert f"FAILED {line}" in status.stdout, status.stdout + status.stderr

    # Fixed, the same command resumes and finishes: every step applied once, on both sides.
    (tmp_path / "broken").unlink()
    again = nebula("run", str(job), "--stack", stack.run_dir)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    for worker in ("head-0", "tail-0"):
        assert len(history(run_dir, worker)) == 30
        rows = [json.loads(r)["step"] for r in (run_dir / "history" / f"{worker}.jsonl").read_text().splitlines()]
        assert sorted(set(rows)) == list(range(1, 31)), rows
    assert "FAILED" not in nebula("status", str(job), "--stack", stack.run_dir).stdout


def test_a_federation_link_that_cannot_come_up_is_named_with_rabbitmqs_words_and_since_when(
        stack: StackHandle) -> None:
    """A link the broker keeps retrying is shown by ``stack status``, then ``up`` again once healed."""
    import time

    job = stack.new_job(prefix="link")
    link = f"link from cluster-a to cluster-b (127.0.0.1:{stack.stack.layout.node('cluster-a').relay_port})"

    def stack_status() -> str:
        """This job's link line of ``stack status`` (the stack's other jobs have theirs)."""
        out = nebula("stack", "status", "--stack", stack.run_dir, timeout=60)
        assert out.returncode == 0, out.stderr
        return next((line for line in out.stdout.splitlines()
                     if line.startswith(link) and line.endswith(f"[{job.vhost}]")), out.stdout)

    deadline = time.monotonic() + 60
    while (line := stack_status()) != f"{link}: up [{job.vhost}]":
        assert time.monotonic() < deadline, line
        time.sleep(1)
    try:
        stack.stack.cut("cluster-a")  # every connection to cluster-a's broker reset, new ones refused
        deadline = time.monotonic() + 60
        while not (line := stack_status()).startswith(f"{link}: down for"):
            assert time.monotonic() < deadline, line
            time.sleep(1)
        assert "the connection was closed" in line or "nothing listens there" in line, line
        first_s = int(line.split("down for ")[1].split(" s")[0])
        deadline = time.monotonic() + 30
        while True:  # the same outage, counted across commands (the link retries meanwhile)
            later = stack_status()
            if later.startswith(f"{link}: down for ") and int(later.split("down for ")[1].split(" s")[0]) >= first_s + 2:
                break
            assert time.monotonic() < deadline and ("down for" in later or "starting for" in later), (line, later)
            time.sleep(1)
    finally:
        stack.clean_wan()
    deadline = time.monotonic() + 60
    while (line := stack_status()) != f"{link}: up [{job.vhost}]":
        assert time.monotonic() < deadline, line
        time.sleep(1)


def test_a_rank_started_twice_is_refused_in_one_line_and_the_running_job_goes_on_undisturbed(
        stack: StackHandle, tmp_path: Path) -> None:
    import signal
    import time

    from tests.fixtures.jobs import step_of, worker_status

    copy_split_example(tmp_path)
    run_dir, job = tmp_path / "run", tmp_path / "job.toml"
    job.write_text(split_job(f"twice-{os.getpid()}", run_dir, steps=100000, head="mlp_torch", tail="mlp_torch"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEBULA__")}
    first = subprocess.Popen([sys.executable, "-m", "nebula_mq", "run", str(job), "--stack", stack.run_dir],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    def reaches(step: int) -> None:
        deadline = time.monotonic() + 120
        while step_of(run_dir, "tail-0") < step:
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)

    try:
        reaches(2)
        logs = {w: (run_dir / "logs" / f"{w}.log").stat().st_size for w in ("head-0", "tail-0")}
        again = nebula("run", str(job), "--stack", stack.run_dir)
        by_hand = nebula("worker", str(job), "--role", "split-tail", "--stack", stack.run_dir)
        for refused in (again, by_hand):
            assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
            assert "tail-0 (cluster-b) of job twice-" in refused.stderr and "is already running (nebula-mq run" \
                in refused.stderr and "refused, nothing touched" in refused.stderr, refused.stderr
        assert "Traceback" not in again.stdout + again.stderr + by_hand.stderr
        reaches(step_of(run_dir, "tail-0") + 20)  # the running job goes on
        first.send_signal(signal.SIGINT)
        out, _ = first.communicate(timeout=180)
        assert first.returncode == 130 and "failed" not in out, out[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    for worker, size in logs.items():  # the refused ones wrote nothing into the running ranks' logs
        assert "already running" not in (run_dir / "logs" / f"{worker}.log").read_text()[size:]
        assert worker_status(run_dir, worker)["state"] == "stopped"
    steps = [json.loads(r)["step"] for r in (run_dir / "history" / "tail-0.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))  # each step once, in order: nothing disturbed


def test_a_peer_is_trusted_from_its_brokers_handshake_only_with_its_fingerprint_and_revocations_follow(
        stack: StackHandle, tmp_path: Path) -> None:
    """``stack trust``'s reading (``security.trust``) against a real broker: the CA pinned by its
    fingerprint and named for its cluster, the CRL the broker's certificate carries, and a
    revocation there read again by the refresh, with nothing carried by hand."""
    import pytest as _pytest

    from nebula_mq.errors import CertificateError
    from nebula_mq.security.certs import ClusterCA
    from nebula_mq.security.revocation import revoke
    from nebula_mq.security.trust import fingerprint, refresh_peer, trust_peer

    theirs = stack.stack.ca("cluster-a")
    port = stack.stack.layout.node("cluster-a").tls_port
    mine = ClusterCA(tmp_path / "certs", "cluster-z")
    right = fingerprint(theirs.ensure_ca())
    with _pytest.raises(CertificateError, match=r"has fingerprint sha256:[0-9a-f]{64}, not sha256:0+: not trusted"):
        trust_peer(mine, "cluster-a", "127.0.0.1", port, "sha256:" + "0" * 64)
    with _pytest.raises(CertificateError, match=r"belongs to another cluster \(its CA is 'nebula-mq CA cluster-a'"):
        trust_peer(mine, "cluster-b", "127.0.0.1", port, right)
    assert not (mine.dir / "peers").exists()  # nothing trusted by a refusal
    chain = trust_peer(mine, "cluster-a", "127.0.0.1", port, right)
    assert fingerprint(mine.peer_ca("cluster-a")) == right and (mine.dir / "peers" / "cluster-a.crl").is_file()
    revoked = theirs.ensure_client(f"trust-probe-{os.getpid()}")
    serial = revoke(stack.stack.layout.certs_dir, theirs, revoked.cn)
    assert serial not in {r.serial_number for r in chain.crl}
    fresh = refresh_peer(mine, "cluster-a", "127.0.0.1", port)  # the broker's next handshake carries it
    assert serial in {r.serial_number for r in fresh.crl}
