"""Striped flows on the real TLS stack: a split model whose activations and gradients each cross
the WAN over three queues (three federation links), under WAN cuts and a rolling restart of both
brokers (issue 29: links that stay down after a rolling restart, upstream queues left filling)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nebula_mq import topology
from nebula_mq.chaos import Fault
from tests.fixtures.jobs import copy_split_example, run_chaos, split_job
from tests.fixtures.lanes import CPU_HEAVY

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow, CPU_HEAVY]


def test_a_striped_job_under_wan_cuts_and_a_restart_ends_bit_identical_to_its_clean_run(  # type: ignore[no-untyped-def]
        stack, tmp_path: Path) -> None:
    """Order is restored and exactly-once holds with the flow spread over three links: the
    striped run under faults and the striped clean run end with the same checkpoints, bit for
    bit. (A striped job trains bit-identically to a one-queue job: tests/unit/workers/test_split.py.)"""
    copy_split_example(tmp_path)  # the user's model, next to their job file
    striped = tmp_path / "striped.toml"
    striped.write_text(split_job("stripes", tmp_path / "striped", seed=11, steps=80, extra="stripes = 3"))
    # The chaos run holds the job at each fault's step until the fault is in. Cluster-b's node and
    # then cluster-a's restart one after the other, with messages queued upstream of both.
    schedule = [Fault(10, "cut", "", 2.0), Fault(30, "restart", "cluster-b"), Fault(31, "restart", "cluster-a"),
                Fault(50, "cut", "", 1.5)]
    report, text, _logs = run_chaos(stack, striped, schedule, 400)
    assert report.complete and report.identical, text
    assert len(report.faults) == len(schedule), text
    # Every link came back and nothing is left behind: no copy of a flow, upstream or downstream,
    # holds a message once the job has ended (the status stream keeps its history by design), and
    # every federation link of the job runs.
    vhost, feed = topology.vhost("stripes-chaos"), topology.status_stream("stripes-chaos")
    for cluster in stack.stack.clusters:
        left = {q: d.messages for q, d in stack.stack.queue_depths(cluster, vhost).items() if d.messages and q != feed}
        assert not left, (cluster, left, text)
        links = json.loads(stack.stack.rabbitmqctl(cluster, "federation_status", "--formatter", "json") or "[]")
        mine = [link for link in links if link.get("vhost") == vhost]
        assert mine and all(link.get("status") == "running" for link in mine), (cluster, mine)

    # Every stripe carried traffic both ways (the workers' per-flow counters).
    received = (tmp_path / "striped" / "clean" / "metrics" / "tail-0.prom").read_text()
    for stripe in ("activations", "activations-s1", "activations-s2", "reply-head-0-s2"):
        assert f'flow="{stripe}"' in received, stripe
