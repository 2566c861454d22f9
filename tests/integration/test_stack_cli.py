"""``nebula-mq stack`` and ``nebula-mq wan`` acting on the session's running stack."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nebula_mq.cli import main
from nebula_mq.stack import Stack
from nebula_mq.stack.layout import RELAY_OFFSET, StackLayout, port_free, stack_ports
from tests.fixtures.stack import StackHandle, pick_base_port

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nebula_mq", *args], capture_output=True, text=True,
                          timeout=timeout)


def _bound(port: int) -> bool:
    return not port_free(port)


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (a node's HOME, a relay's control file)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_stack_status_lists_running_nodes(stack: StackHandle) -> None:
    out = _cli("stack", "status", "--run-dir", stack.run_dir)
    assert out.returncode == 0, out.stderr
    for n in stack.stack.layout.nodes:
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith(n.cluster))
        assert "running" in line and f":{n.tls_port}" in line
        assert f"management https://localhost:{n.mgmt_port}/" in line


def test_stack_up_on_a_running_stack_is_a_no_op_and_other_settings_are_refused_not_ignored(
        stack: StackHandle) -> None:
    pids = {c: s.relay_pid for c, s in stack.stack.status().items()}
    out = _cli("stack", "up", "--run-dir", stack.run_dir)
    assert out.returncode == 0, out.stderr
    assert {c: s.relay_pid for c, s in stack.stack.status().items()} == pids
    base = stack.stack.layout.base_port
    other = _cli("stack", "up", "--run-dir", stack.run_dir, "--base-port", str(base + 100))
    assert other.returncode == 1 and other.stderr.strip() == (
        f"nebula-mq: error: the stack in {stack.run_dir} is running with --base-port {base} (not {base + 100}) and "
        f"keeps its layout while it runs: `nebula-mq stack down --stack {stack.run_dir}` first, then `stack up` "
        f"again"), other.stderr
    assert {c: s.relay_pid for c, s in stack.stack.status().items()} == pids and stack.stack.layout.base_port == base


def test_wan_cli_shapes_cuts_and_heals_a_running_relay(stack: StackHandle) -> None:
    try:
        out = _cli("wan", "shape", "--run-dir", stack.run_dir, "--to", "cluster-b", "--rate", "25", "--delay", "7")
        assert out.returncode == 0, out.stderr
        applied = stack.stack.wan_status()["to-cluster-b"]["shape"]
        assert (applied["rate_mbit"], applied["delay_ms"], applied["cut"]) == (25.0, 7.0, False)
        assert _cli("wan", "cut", "--stack", stack.run_dir, "--to", "cluster-b").returncode == 0
        assert stack.stack.wan_status()["to-cluster-b"]["shape"]["cut"] is True
        assert stack.stack.wan_status()["to-cluster-a"]["shape"]["cut"] is False
        # `wan status`: one readable line per link (--json for the raw state).
        table = _cli("wan", "status", "--stack", stack.run_dir).stdout.splitlines()
        assert table[0].split()[:3] == ["link", "state", "rate"], table
        assert next(ln for ln in table if ln.startswith("to-cluster-b")).split()[1:4] == ["CUT", "25", "Mbit/s"]
        assert next(ln for ln in table if ln.startswith("to-cluster-a")).split()[1] == "up"
        out = _cli("wan", "heal", "--stack", stack.run_dir)  # (--run-dir, the older spelling, works too)
        assert out.returncode == 0, out.stderr
        assert next(ln for ln in out.stdout.splitlines() if ln.startswith("to-cluster-b")).split()[1] == "up"
        raw = json.loads(_cli("wan", "status", "--stack", stack.run_dir, "--json").stdout)
        assert raw["to-cluster-b"]["shape"]["cut"] is False
    finally:
        stack.clean_wan()


def test_stack_restart_restarts_one_node_and_a_misspelt_cluster_is_named(stack: StackHandle) -> None:
    out = _cli("stack", "restart", "cluster-b", "--stack", stack.run_dir)
    assert out.returncode == 0, out.stderr
    assert "cluster-b: restarted in" in out.stdout
    assert all(s.running for s in stack.stack.status().values())
    out = _cli("stack", "restart", "clustr-b", "--stack", stack.run_dir)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "unknown cluster 'clustr-b'" in out.stderr and "did you mean 'cluster-b'?" in out.stderr


def test_stack_status_without_a_stack_is_a_clear_error(tmp_path) -> None:
    out = _cli("stack", "status", "--run-dir", str(tmp_path))
    assert out.returncode == 1
    assert "no stack in" in out.stderr


# A node's ports (AMQPS, management) are checked by one loop before it boots; the relay's by
# another, after the nodes are up: one case each.
@pytest.mark.parametrize("busy_offset", [1, RELAY_OFFSET + 1], ids=["cluster-b-tls", "cluster-b-relay"])
def test_stack_up_on_a_busy_port_stops_what_it_started_and_names_the_port(busy_offset: int) -> None:
    run_dir = tempfile.mkdtemp(prefix="nebula-busy-", dir="/tmp")
    base = pick_base_port()
    busy = base + busy_offset
    ports = stack_ports(base, 2)
    try:
        with socket.socket() as holder:
            # A node another test stopped may have left this port in TIME_WAIT: that does not
            # make it busy for a node (which binds with SO_REUSEADDR), nor for this holder.
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind(("127.0.0.1", busy))
            holder.listen()
            out = _cli("stack", "up", "--run-dir", run_dir, "--base-port", str(base),
                       "--prefix", f"busy{os.getpid()}", timeout=240)
            assert out.returncode == 1, out.stdout + out.stderr
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1, out.stderr
            assert f"port {busy} is already in use" in lines[0]
            assert "stopped what this `stack up` had started (" in lines[0]
            # The node(s) it had booted really were stopped: nothing of this stack dir runs.
            assert _processes_mentioning(run_dir) == []
            assert not any(s.running or s.relay_pid for s in Stack.open(run_dir).status().values())
            assert [p for p in ports if p != busy and _bound(p)] == []
    finally:
        if StackLayout.load(Path(run_dir)) is not None:  # `stack up` got as far as saving its layout
            Stack.open(run_dir).down()
        shutil.rmtree(run_dir, ignore_errors=True)


def test_run_with_a_misspelt_cluster_says_it_is_unknown_and_suggests_one(
    stack: StackHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.toml"
    job.write_text((ROOT / "config" / "abnet-delta.toml").read_text()
                   .replace('tail_cluster = "cluster-b"', 'tail_cluster = "clustr-b"')
                   .replace('run_dir = "../run/jobs/abnet-delta"', f'run_dir = "{tmp_path / "run"}"'))
    for name in [n for n in os.environ if n.startswith("NEBULA__")]:
        monkeypatch.delenv(name)
    assert main(["run", str(job), "--stack", stack.run_dir]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"unknown cluster 'clustr-b' in {job} [abnet] tail_cluster (did you mean 'cluster-b'?)" in err
    assert f"the stack in {stack.run_dir} has cluster-a, cluster-b." in err
    # Set by an override, the variable is named instead of the file.
    job.write_text(job.read_text().replace('tail_cluster = "clustr-b"', 'tail_cluster = "cluster-b"'))
    monkeypatch.setenv("NEBULA__ABNET__TAIL_CLUSTER", "clustr-b")
    assert main(["run", str(job), "--stack", stack.run_dir]) == 1
    assert "'clustr-b' in environment variable NEBULA__ABNET__TAIL_CLUSTER" in capsys.readouterr().err


CTRL_C_JOB = """
[job]
id = "ctrlc-{tag}"
scenario = "abnet"
seed = 3
steps = 5000
run_dir = "{run_dir}"

[abnet]
preset = "tiny"
batch_size = 8
in_flight = 2
checkpoint_every = 2
src_cluster = "cluster-a"
tgt_cluster = "cluster-b"
"""


def _start_run(job: Path, stack: StackHandle, log: Path) -> subprocess.Popen[bytes]:
    """``nebula-mq run`` as a terminal starts it: run and its workers in one process group."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEBULA__")}
    return subprocess.Popen([sys.executable, "-m", "nebula_mq", "run", str(job), "--stack", stack.run_dir],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _wait_for_step(run_dir: Path, worker: str, step: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    from tests.fixtures.jobs import step_of

    deadline = time.monotonic() + 180
    while step_of(run_dir, worker) < step:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)


def test_ctrl_c_under_run_stops_every_worker_cleanly_and_a_second_one_at_once(
        stack: StackHandle, tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches ``run`` and every worker (one process group), and
    ``run`` forwards a SIGTERM as well: the workers checkpoint and stop, ``run`` exits
    130. Started again, the job resumes; a second Ctrl-C then ends it within seconds."""
    job, run_dir, log = tmp_path / "job.toml", tmp_path / "run", tmp_path / "run.log"
    job.write_text(CTRL_C_JOB.format(tag=os.getpid(), run_dir=run_dir))
    proc = _start_run(job, stack, log)
    try:
        _wait_for_step(run_dir, "enc-0", 4, proc, log)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(120) == 130, log.read_text()[-3000:]
        for worker in ("enc-0", "dec-0"):
            status = json.loads((run_dir / "status" / f"{worker}.json").read_text())
            assert status["state"] == "stopped", status
        assert "failed" not in log.read_text()
        stopped_at = json.loads((run_dir / "status" / "enc-0.json").read_text())["step"]
        assert "run the same command to resume" in log.read_text()

        proc = _start_run(job, stack, log)
        _wait_for_step(run_dir, "enc-0", stopped_at + 2, proc, log)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.05)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 130, log.read_text()[-3000:]
        assert time.monotonic() - started < 30
        text = log.read_text() + "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
        assert "Traceback" not in text, text[-3000:]
        # A worker still busy with its micro-batch at the second Ctrl-C exits at once, and says so.
        if any(f"exit {code}" in log.read_text() for code in (130, -9)):  # (-2: already shutting down)
            assert "second interrupt" in text, text[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_ctrl_c_while_the_workers_start_is_a_clean_stop(stack: StackHandle, tmp_path: Path) -> None:
    """A Ctrl-C in the first second of the workers' lives, while they import paddle (whose own
    handlers would end them with a fatal error): held until their handlers are in, it is one
    stop request like any later one: every worker exits 0, ``run`` 130, nothing failed."""
    job, run_dir, log = tmp_path / "job.toml", tmp_path / "run", tmp_path / "run.log"
    job.write_text(CTRL_C_JOB.format(tag=f"early-{os.getpid()}", run_dir=run_dir))
    proc = _start_run(job, stack, log)
    try:
        deadline = time.monotonic() + 60
        while not all((run_dir / "logs" / f"{w}.log").exists() for w in ("enc-0", "dec-0")):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(120) == 130, log.read_text()[-3000:]
        text = log.read_text()
        assert "enc-0: exit 0" in text and "dec-0: exit 0" in text and "failed" not in text, text[-3000:]
        workers = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
        assert "FatalError" not in workers and "Traceback" not in workers, workers[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_run_restarts_a_worker_that_dies_and_the_job_still_finishes(stack: StackHandle, tmp_path: Path) -> None:
    """Supervision: a SIGKILLed worker is restarted by ``run`` (no one watching), resumes from
    its checkpoint, and the job ends with rc 0 at the last step."""
    from tests.fixtures.jobs import final_checkpoint

    job, run_dir, log = tmp_path / "job.toml", tmp_path / "run", tmp_path / "run.log"
    # 120 steps: the job outlives the broker's 5 s statistics interval by seconds, so the
    # workers' final queue samples have sizes (a queue younger than that has none yet).
    job.write_text(CTRL_C_JOB.format(tag=f"restart-{os.getpid()}", run_dir=run_dir).replace("steps = 5000", "steps = 120"))
    proc = _start_run(job, stack, log)
    try:
        _wait_for_step(run_dir, "dec-0", 10, proc, log)
        pid = json.loads((run_dir / "status" / "dec-0.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    text = log.read_text()
    assert "worker dec-0 exited -9" in text and "restarting dec-0" in text and "(restart 1 of 5)" in text, text[-3000:]
    assert {w: final_checkpoint(run_dir, w).step for w in ("enc-0", "dec-0")} == {"enc-0": 120, "dec-0": 120}
    faults = [json.loads(line) for line in (run_dir / "faults.jsonl").read_text().splitlines()]
    assert [(f["kind"], f["target"]) for f in faults] == [("restart", "dec-0")]
    assert faults[0]["recovered_after_s"] is not None  # the restarted decoder made steps again
    audit = [json.loads(line) for line in (run_dir / "audit" / "audit.jsonl").read_text().splitlines()]
    submitted = [r for r in audit if r["event"] == "job_submitted"]
    assert len(submitted) == 1 and submitted[0]["workers"] == ["dec-0", "enc-0"], submitted
    # The workers sampled their queues' sizes in bytes from the management API, as the job's
    # monitoring user (messages over AMQP, bytes over HTTPS), and once more as they finished.
    for worker in ("enc-0", "dec-0"):
        rows = [json.loads(line) for line in (run_dir / "queues" / f"{worker}.jsonl").read_text().splitlines()]
        last = {row["queue"]: row for row in rows}  # each queue's final sample
        # Sizes lag by up to the statistics interval: a drained queue may still show old bytes.
        assert len(last) == 2 and all(r["messages"] == 0 and r["bytes"] >= 0 for r in last.values()), rows
