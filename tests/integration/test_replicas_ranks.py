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

from tests.fixtures.jobs import column, final_checkpoint, free_port_range, run_to_end
from tests.fixtures.lanes import CPU_HEAVY
from tests.fixtures.pairs import SPLIT_EXAMPLE

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow, CPU_HEAVY]

JOB = """
[job]
id = "replicas-ranks-{ranks}"
scenario = "replicas"
seed = 7
steps = 6
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


def params(run_dir: Path, worker: str) -> dict[str, np.ndarray]:
    """A worker's model and outer weights at the end."""
    arrays = final_checkpoint(run_dir, worker).arrays
    return {k: np.asarray(v) for k, v in arrays.items() if k.startswith(("model/param/", "outer/param/"))}


def test_two_ranks_per_cluster_train_what_one_rank_trains_with_identical_ranks(stack: Any, tmp_path: Path) -> None:
    """The same job with one rank and with two ranks per cluster (each inner step's batch cut in
    two, the gradients' mean all-reduced), float32 pseudo-gradients: every rank of every cluster
    ends on the same outer weights, the two ranks of a cluster on the same model bit for bit,
    and both end where one rank per cluster ends, to float tolerance."""
    for name in ("mlp.py", "mlp_data.py", "mlp_replicas.py"):
        shutil.copy(SPLIT_EXAMPLE / name, tmp_path)
    runs = {}
    for ranks in (1, 2):
        config = tmp_path / f"ranks{ranks}.toml"
        config.write_text(JOB.format(ranks=ranks, run_dir=tmp_path / f"run{ranks}", port=free_port_range(6)))
        job = run_to_end(config, stack.run_dir)
        assert sorted(job.children) == sorted(["replica-0", "replica-1"] + (["replica-0-r1", "replica-1-r1"]
                                                                            if ranks == 2 else []))
        runs[ranks] = tmp_path / f"run{ranks}"
    one, two = runs[1], runs[2]
    first = params(two, "replica-0")
    for worker in ("replica-0-r1", "replica-1", "replica-1-r1"):
        mine = params(two, worker)
        assert mine.keys() == first.keys()
        for k in first:
            if k.startswith("outer/") or worker.startswith("replica-0"):
                np.testing.assert_array_equal(mine[k], first[k], err_msg=f"{worker} {k}")
    for worker in ("replica-0", "replica-1"):
        single, mine = params(one, worker), params(two, worker)
        assert single.keys() == mine.keys()
        for k in single:
            np.testing.assert_allclose(mine[k], single[k], rtol=2e-4, atol=2e-5, err_msg=f"{worker} {k}")
        # The loss each event (the mean over the cluster's ranks) is one rank's, and it learns.
        np.testing.assert_allclose(column(two, worker, "loss"), column(one, worker, "loss"), rtol=1e-4)
    losses = column(two, "replica-0-r1", "loss")
    assert len(losses) == 6 and losses[-1] < losses[0], losses
