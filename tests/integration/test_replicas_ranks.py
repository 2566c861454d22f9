"""Ranks inside each cluster of a replicas job (``[replicas] ranks``), on the session's TLS stack
through the launcher (``nebula-mq run``'s plan): two clusters, each a gloo group of two
processes. Rank 0 of each cluster talks across the WAN and gives every event's average to its
other rank on its own broker."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nebula_mq.chaos.schedule import Fault
from nebula_mq.settings import load_settings
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.jobs import column, final_checkpoint, free_port_range, run_chaos
from tests.fixtures.lanes import CPU_HEAVY
from tests.fixtures.pairs import SPLIT_EXAMPLE
from tests.fixtures.replicas import run

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow, CPU_HEAVY]

STEPS = 8
JOB = """
[job]
id = "replicas-ranks-{ranks}"
scenario = "replicas"
seed = 7
steps = {steps}
run_dir = "{run_dir}"

[replicas]
clusters = ["cluster-a", "cluster-b"]
inner_steps = 4
codec = "none"
model = "mlp_replicas:build_replica"
checkpoint_every = 3
ranks = {ranks}
gloo_port = {port}
group_timeout_s = 60
"""


def params(run_dir: Path, worker: str, kinds: tuple[str, ...] = ("model/param/", "outer/param/")) -> dict[str, np.ndarray]:
    """A worker's model and outer weights at the end (or the other ``kinds`` of its arrays)."""
    arrays = final_checkpoint(run_dir, worker).arrays
    return {k: np.asarray(v) for k, v in arrays.items() if k.startswith(kinds)}


def job_file(tmp: Path, ranks: int) -> Path:
    config = tmp / f"ranks{ranks}.toml"
    config.write_text(JOB.format(ranks=ranks, steps=STEPS, run_dir=tmp / f"run{ranks}", port=free_port_range(6)))
    return config


def test_two_ranks_per_cluster_train_what_one_rank_trains_and_ride_out_killed_ranks(stack: Any,
                                                                                   tmp_path: Path) -> None:
    """Two ranks per cluster (each inner step's batch cut in two, the gradients' mean
    all-reduced), float32 pseudo-gradients, run clean and then with cluster-b's rank 1 and
    cluster-a's rank 0 (its WAN rank) killed -9 in turn, each group restarted from its last
    common checkpoint: the killed run ends bit-identical to the clean one; every rank of every
    cluster ends on the same outer weights, the two ranks of a cluster on the same model bit for
    bit, and both where one rank per cluster ends (run in process), to float tolerance."""
    for name in ("mlp.py", "mlp_data.py", "mlp_replicas.py"):
        shutil.copy(SPLIT_EXAMPLE / name, tmp_path)
    schedule = [Fault(3, "kill", "replica-1-r1", 0.5), Fault(5, "kill", "replica-0", 0.5)]
    report, text, logs = run_chaos(stack, job_file(tmp_path, 2), schedule, 300)
    assert set(report.digests) == {"replica-0", "replica-0-r1", "replica-1", "replica-1-r1"}, text
    assert report.complete and report.identical and len(report.faults) == 2, text
    assert any("replica-0, replica-0-r1" in line for line in logs), logs  # the group restarted together

    one = tmp_path / "run1"
    run(load_settings(job_file(tmp_path, 1)), MemoryBroker())  # one rank per cluster, in process
    two = tmp_path / "run2" / "clean"
    # The ranks of a cluster: the same model and inner optimizer (its moments are not reset at
    # the end, as the weights are), and every rank the same outer weights and momentum.
    for ranks in (("replica-0", "replica-0-r1"), ("replica-1", "replica-1-r1"), ("replica-0", "replica-1-r1")):
        kinds = ("model/", "outer/") if ranks[0][:9] == ranks[1][:9] else ("outer/",)
        a, b = (params(two, w, kinds) for w in ranks)
        assert a.keys() == b.keys() and any(k.startswith("model/opt/") for k in a) == (kinds[0] == "model/")
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{ranks} {k}")
    for worker in ("replica-0", "replica-1"):
        single, mine = params(one, worker), params(two, worker)
        assert single.keys() == mine.keys()
        for k in single:
            np.testing.assert_allclose(mine[k], single[k], rtol=2e-4, atol=2e-5, err_msg=f"{worker} {k}")
        # The loss each event (the mean over the cluster's ranks) is one rank's, and it learns.
        np.testing.assert_allclose(column(two, worker, "loss"), column(one, worker, "loss"), rtol=1e-4)
    losses = column(two, "replica-0-r1", "loss")
    assert len(losses) == STEPS and losses[-1] < losses[0], losses
