"""``nebula-mq chaos --soak``, CI-sized: a split job for two minutes under a random
fault of every kind (WAN cut, SIGKILL, broker restart, memory alarm), on the real TLS stack.
Nothing may grow without bound, no worker may exit on its own and nothing may be dead-lettered.
Whether the step rate decays is judged by the 60-minute soak that ``docs/benchmarks.md`` quotes: in two
minutes with a fault every 10 s, where the faults fall decides it (see below)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nebula_mq.chaos.soak import NORMAL_WATERMARK
from tests.fixtures.jobs import copy_split_example, split_job
from tests.fixtures.lanes import CPU_HEAVY

# In the CPU-heavy lane: its step-rate verdict needs a machine whose load does not swing.
pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow, pytest.mark.timeout(420), CPU_HEAVY]

# Every kind of fault comes (a shuffled round of four, a fault every 5-15 s after the last one
# ended): a broker restart blocks the schedule until the node is back, 40 s and more on a loaded
# host, and the soak runs past its two minutes until the round is done, then settles.
MINUTES = 2.0
FAULT_EVERY_S = 10
SEED = 9


def test_a_short_soak_under_every_kind_of_fault_shows_no_growth(stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    copy_split_example(tmp_path)
    config = tmp_path / "job.toml"
    config.write_text(split_job("soak", tmp_path / "run", seed=3))
    # Its own session: a soak that overruns is killed with its workers and log pipes, which would
    # otherwise outlive it (their parent gone, no fixture sees them) and train on for ever.
    soak = subprocess.Popen(
        [sys.executable, "-m", "nebula_mq", "chaos", str(config), "--stack", str(stack.run_dir),
         "--soak", str(MINUTES), "--fault-every", str(FAULT_EVERY_S), "--sample-every", "4", "--seed", str(SEED)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = soak.communicate(timeout=360)
    finally:
        if soak.poll() is None:
            os.killpg(soak.pid, signal.SIGKILL)
            soak.wait(30)
        for cluster in stack.stack.clusters:  # a soak killed during an alarm fault leaves it raised
            stack.stack.rabbitmqctl(cluster, "set_vm_memory_high_watermark", NORMAL_WATERMARK)
        stack.clean_wan()
    text = stdout + stderr[-3000:]
    written = tmp_path / "run" / "soak" / "soak.json"
    assert written.is_file(), text
    report = json.loads(written.read_text())
    # Every verdict but the step rate's must pass. The step rate compares the medians of the
    # window's two halves, and in a CI-sized soak the faults' places decide it: on a fast host
    # six came, two of them (a kill and a broker restart at 93 and 103 s of a 150 s soak) in the second
    # half, and the rate read 80 -> 29 steps/s with nothing leaking.
    failing = {t["series"] for t in report["trends"] if not t["ok"]}
    assert failing <= {"job steps_per_s"}, text
    assert soak.returncode == (1 if failing else 0), text
    assert ("soak FAILED" if failing else "soak passed") in stdout, text
    kinds = {"WAN cut": 0, "SIGKILL": 0, "broker restart": 0, "memory alarm": 0}
    for fault in report["faults"]:
        for kind in kinds:
            kinds[kind] += kind in fault
    assert all(kinds.values()), (kinds, text)
    series = {t["series"] for t in report["trends"]}
    for owner in ("head-0", "tail-0", "cluster-a", "cluster-b"):
        assert {f"{owner} rss_mb", f"{owner} fds"} <= series, (owner, sorted(series))
    assert {"cluster-b dead_letters", "cluster-a queued", "job steps_per_s"} <= series, sorted(series)
    # Enough points after warm-up for each line to mean something. An owner is not sampled while
    # it settles after its fault (SETTLE_S), and on a loaded host a sample round takes 10 s or
    # more: a worker killed late in the run had 4 (seen in CI).
    assert all(t["samples"] >= 3 for t in report["trends"] if t["kind"] != "steps_per_s"), text
    assert sum(t["samples"] for t in report["trends"]) >= 5 * len(report["trends"]), text
    assert report["steps"] > 50 and not report["unplanned_exits"], text
