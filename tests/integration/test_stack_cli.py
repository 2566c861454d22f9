"""``nebula-mq stack`` and ``nebula-mq wan`` acting on the session's running stack."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fixtures.stack import StackHandle

pytestmark = pytest.mark.broker


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nebula_mq", *args], capture_output=True, text=True, timeout=60)


def test_stack_status_lists_running_nodes(stack: StackHandle) -> None:
    out = _cli("stack", "status", "--run-dir", stack.run_dir)
    assert out.returncode == 0, out.stderr
    for n in stack.stack.layout.nodes:
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith(n.cluster))
        assert "running" in line and f":{n.tls_port}" in line


def test_stack_up_on_a_running_stack_is_a_no_op(stack: StackHandle) -> None:
    pids = {c: s.relay_pid for c, s in stack.stack.status().items()}
    out = _cli("stack", "up", "--run-dir", stack.run_dir)
    assert out.returncode == 0, out.stderr
    assert {c: s.relay_pid for c, s in stack.stack.status().items()} == pids


def test_wan_cli_shapes_cuts_and_heals_a_running_relay(stack: StackHandle) -> None:
    try:
        out = _cli("wan", "shape", "--run-dir", stack.run_dir, "--to", "cluster-b", "--rate", "25", "--delay", "7")
        assert out.returncode == 0, out.stderr
        applied = stack.stack.wan_status()["to-cluster-b"]["shape"]
        assert (applied["rate_mbit"], applied["delay_ms"], applied["cut"]) == (25.0, 7.0, False)
        assert _cli("wan", "cut", "--run-dir", stack.run_dir, "--to", "cluster-b").returncode == 0
        assert stack.stack.wan_status()["to-cluster-b"]["shape"]["cut"] is True
        assert stack.stack.wan_status()["to-cluster-a"]["shape"]["cut"] is False
        out = _cli("wan", "heal", "--run-dir", stack.run_dir)
        assert out.returncode == 0, out.stderr
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("to-cluster-b: "))
        assert json.loads(line.split(": ", 1)[1])["shape"]["cut"] is False
    finally:
        stack.clean_wan()


def test_stack_status_without_a_stack_is_a_clear_error(tmp_path) -> None:
    out = _cli("stack", "status", "--run-dir", str(tmp_path))
    assert out.returncode == 1
    assert "no stack in" in out.stderr
