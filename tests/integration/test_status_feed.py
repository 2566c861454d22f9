"""One view of the whole job from either cluster (issue 28): every worker publishes its status
to the job's status exchange, federation carries it to the other cluster, and ``nebula-mq
status --feed CLUSTER`` on either broker lists every worker of both clusters with how long ago
it was heard from; a worker killed mid-run is LOST once silent past ``--lost-after``; the live
report (``report --serve --feed CLUSTER``) lists them too. Real brokers, TLS, the federation link
through the WAN relay."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nebula_mq.launch import JobProcesses
from tests.fixtures.jobs import copy_split_example, split_job

pytestmark = [pytest.mark.broker, pytest.mark.paddle]


def feed(config: Path, stack_dir: Path, cluster: str, *extra: str) -> dict[str, dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "nebula_mq", "status", str(config), "--stack", str(stack_dir),
                          "--feed", cluster, "--json", *extra], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return {row["worker"]: row for row in json.loads(out.stdout)["workers"]}


def served_feed(config: Path, stack_dir: Path, cluster: str, out: Path, wait_s: float = 30.0) -> dict[str, list[str]]:
    """The feed table of the page ``report --serve --feed`` serves, once it lists two workers
    (at most ``wait_s`` seconds): worker -> its cells' text."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "nebula_mq", "report", str(config), "--serve", "--feed", cluster,
                             "--stack", str(stack_dir), "--out", str(out), "--port", str(port), "--every", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rows: dict[str, list[str]] = {}
    page = ""
    try:
        deadline = time.monotonic() + wait_s
        while len(rows) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.3)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/report.html", timeout=5) as response:
                    page = response.read().decode()
            except OSError:
                continue  # not serving yet
            if '<section id="feed">' not in page:
                continue
            section = page.split('<section id="feed">', 1)[1].split("</section>", 1)[0]
            cells = ([re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
                     for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", section))
            rows = {c[0]: c for c in cells if c}
    finally:
        proc.terminate()
        output = proc.communicate(timeout=10)[0]
    assert "Traceback" not in output and "cannot read" not in output, output
    assert '<section id="summary">' in page, page[-2000:]  # this host's files, as without --feed
    return rows


def test_either_cluster_sees_every_worker_and_a_silent_one_is_lost(stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    copy_split_example(tmp_path)
    # A worker killed mid-run says nothing more: LOST once silent past --lost-after, while its
    # peer, still running and waiting for it, keeps being heard (a message every 10 s). It is
    # killed first, and the finished job's checks below run while it stays silent.
    config2 = tmp_path / "job2.toml"
    config2.write_text(split_job("feed2", tmp_path / "run2", steps=100000, checkpoint_every=50))
    job2 = JobProcesses(str(config2), str(stack.run_dir))
    job2.provision()
    job2.start_all()
    try:
        deadline = time.monotonic() + 120
        while job2.slowest_step() < 5 and job2.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert job2.slowest_step() >= 5, job2.steps()
        deadline = time.monotonic() + 60
        while feed(config2, stack.run_dir, "cluster-a").get("tail-0", {}).get("reported") != "running":
            assert time.monotonic() < deadline, "tail-0's status never reached cluster-a's feed"
            time.sleep(0.5)  # its first sample (at the first step) goes out, and crosses the link
        job2.signal("tail-0", signal.SIGKILL)
        killed_at = time.monotonic()
        _a_finished_job_is_seen_from_either_cluster(stack, tmp_path)
        # LOST past 20 s: twice the running peer's 10 s between messages, so a loaded machine's late
        # message or slow feed still finds it heard, and the killed one silent for longer.
        time.sleep(max(0.0, killed_at + 21.0 - time.monotonic()))
        rows = feed(config2, stack.run_dir, "cluster-a", "--lost-after", "20")
        assert rows["tail-0"]["state"] == "LOST" and rows["tail-0"]["reported"] == "running", rows
        assert rows["tail-0"]["heard_s"] > 20, rows
        assert rows["head-0"]["state"] == "running" and rows["head-0"]["heard_s"] <= 20, rows
    finally:
        job2.signal_all(signal.SIGKILL)
        job2.wait_all(30)


def _a_finished_job_is_seen_from_either_cluster(stack: Any, tmp_path: Path) -> None:
    config = tmp_path / "job.toml"
    config.write_text(split_job("feed", tmp_path / "run", steps=30, checkpoint_every=5))
    job = JobProcesses(str(config), str(stack.run_dir))
    job.provision()
    job.start_all()
    codes = job.wait_all(180)
    assert codes == {"head-0": 0, "tail-0": 0}, codes
    for cluster in ("cluster-a", "cluster-b"):  # each broker hears both clusters' workers
        rows = feed(config, stack.run_dir, cluster)
        assert set(rows) == {"head-0", "tail-0"}, (cluster, rows)
        assert {w: r["cluster"] for w, r in rows.items()} == {"head-0": "cluster-a", "tail-0": "cluster-b"}
        for r in rows.values():
            assert r["state"] == "finished" and r["step"] == r["total"] == 30 and r["checkpoint"] == 30, r
            assert r["host"] == socket.gethostname() and 0 <= r["heard_s"] < 120, r
        assert rows["tail-0"]["loss"] is not None and "queues" in rows["tail-0"]
    # The live report reads the same feed: both clusters' workers, as cluster-b's broker hears them.
    page = served_feed(config, stack.run_dir, "cluster-b", tmp_path / "live")
    assert {w: r[1:5] for w, r in page.items()} == {
        "head-0": ["cluster-a", socket.gethostname(), "finished", "30 / 30"],
        "tail-0": ["cluster-b", socket.gethostname(), "finished", "30 / 30"]}, page
    assert page["head-0"][8] == page["tail-0"][8] == "30" and page["tail-0"][9].endswith(" ago"), page
