"""A node whose graceful stop hangs is still stopped: ``rabbitmqctl stop`` that does not return
within its bound is followed by SIGTERM, then SIGKILL, and ``stop`` returns once the VM is
gone (a hung stop during a broker restart failed a CI run). The "VM" here is a process whose
command line looks like the node's (``beam`` and the node's home), and ``rabbitmqctl`` a script
that hangs: a real node's graceful stop cannot be made to hang on demand."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nebula_mq.errors import StackError
from nebula_mq.stack import node as nodes
from nebula_mq.stack.layout import NodeLayout

HUNG_CTL = "#!/bin/sh\nexec sleep 30\n"  # exec: no orphan holds the captured pipes


@pytest.fixture
def hung_ctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ctl = bin_dir / "rabbitmqctl"
    ctl.write_text(HUNG_CTL)
    ctl.chmod(0o755)
    monkeypatch.setattr(nodes, "RABBITMQ_BIN", bin_dir)


def _vm(layout: NodeLayout, ignore_term: bool) -> subprocess.Popen[bytes]:
    code = ("import signal, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "time.sleep(60)\n")
    layout.home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", code, "beam", str(layout.home)])
    layout.pid_file.parent.mkdir(parents=True, exist_ok=True)
    layout.pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + 10
    while not nodes.is_running(layout) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[NodeLayout]:
    yield NodeLayout("cluster-a", "nebula-stoptest@localhost", 1, 2, 3, str(tmp_path / "node"))


@pytest.mark.parametrize("ignore_term", [False, True], ids=["sigterm", "sigkill"])
def test_a_hung_graceful_stop_is_followed_by_signals(hung_ctl: None, layout: NodeLayout, ignore_term: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodes, "SIGNAL_WAITS_S", tuple((sig, 2.0) for sig, _ in nodes.SIGNAL_WAITS_S))
    vm = _vm(layout, ignore_term)
    try:
        assert nodes.is_running(layout)
        started = time.monotonic()
        nodes.stop(layout, timeout=1.0)
        assert not nodes.is_running(layout)
        assert vm.wait(5) == (-9 if ignore_term else -15)
        # The stop's own waits, and room for a loaded machine: far below the VM's 60 s of sleep.
        assert time.monotonic() - started < 1.0 + 1.0 + (2.0 if ignore_term else 0.0) + 15.0
    finally:
        vm.kill()
        vm.wait(5)


def test_a_vm_that_outlives_every_signal_is_one_error(hung_ctl: None, layout: NodeLayout,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # SIGTERM and SIGKILL both stand in for a signal the "VM" ignores (SIGKILL cannot be).
    monkeypatch.setattr(nodes, "SIGNAL_WAITS_S", ((0, 0.5), (0, 0.5)))
    vm = _vm(layout, ignore_term=False)
    try:
        with pytest.raises(StackError, match="still running after stop, SIGTERM and SIGKILL"):
            nodes.stop(layout, timeout=0.5)
    finally:
        vm.kill()
        vm.wait(5)


def test_a_node_that_is_not_running_is_not_signalled(hung_ctl: None, layout: NodeLayout) -> None:
    nodes.stop(layout, timeout=0.5)  # no pid file: nothing to stop, and the hung CLI is never run
    assert not nodes.is_running(layout)
