"""`nebula-mq bench NAME` killed with SIGTERM unwinds like Ctrl-C: its cleanup runs (a row's
workers killed, the links put back) and it exits 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

SLOW_BENCH = '''
import pathlib, sys, time

def run(args):
    try:
        print("running", flush=True)
        time.sleep(60)
    finally:
        pathlib.Path(sys.argv[1]).write_text("cleaned up")
    return 0
'''


def test_sigterm_runs_the_bench_cleanup_and_exits_143(tmp_path: Path) -> None:
    (tmp_path / "slow_bench.py").write_text(SLOW_BENCH)
    marker = tmp_path / "cleaned"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    bench = subprocess.Popen(
        [sys.executable, "-c", "from nebula_mq.cli.bench import _runner; _runner('slow_bench')(None)", str(marker)],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert bench.stdout is not None
        assert bench.stdout.readline().strip() == "running"
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(10) == 143
        assert marker.read_text() == "cleaned up"
    finally:
        bench.kill()
        bench.wait(10)
