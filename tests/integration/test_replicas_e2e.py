"""The replicas job (DiLoCo across clusters) on real brokers: three TLS nodes joined by federation.

The session's three-node stack (``stack3``); each replica is its own ``nebula-mq worker --role replica``
process with its own identity on its own cluster, publishing its pseudo-gradients on
``pseudograd-<c>-<d>`` to both other clusters through federation and reading theirs.
The model is the split example's MLP as one whole model (examples/split_mlp/mlp_replicas.py),
its modules beside the job files as a user keeps them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.jobs import column, final_checkpoint, start_planned, start_worker, step_of, wait_all
from tests.fixtures.pairs import SPLIT_EXAMPLE
from tests.fixtures.stack import THREE_NODES, StackHandle

pytestmark = [pytest.mark.broker, pytest.mark.paddle, THREE_NODES]

STEPS = 12
WORKERS = ("replica-0", "replica-1", "replica-2")

JOB = """
[job]
id = "placeholder"
scenario = "replicas"
seed = 7
steps = {steps}
run_dir = "{run_dir}"
device = "cpu"

[replicas]
clusters = ["cluster-a", "cluster-b", "cluster-c"]
inner_steps = 5
codec = "int8"
model = "mlp_replicas:build_replica"
checkpoint_every = 3
"""


def start_job(stack: StackHandle, tmp: Path, name: str) -> tuple[dict[str, Path], dict[str, subprocess.Popen[bytes]]]:
    for module in ("mlp.py", "mlp_data.py", "mlp_replicas.py"):
        shutil.copy(SPLIT_EXAMPLE / module, tmp)
    # The plan: one replica per cluster.
    return start_planned(stack, tmp, name, JOB.format(steps=STEPS, run_dir=tmp / name),
                         {w: ("replica", c) for c, w in enumerate(WORKERS)})


def outer_weights(run_dir: Path, worker: str) -> dict[str, np.ndarray]:
    ck = final_checkpoint(run_dir, worker)
    return {k: np.asarray(v) for k, v in ck.arrays.items() if k.startswith("outer/param/")}


@pytest.fixture(scope="module")
def clean_run(stack3: StackHandle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("replicas")
    _, procs = start_job(stack3, tmp, "clean")
    wait_all(procs, tmp, "clean")
    return tmp / "clean"


def test_three_replicas_across_federation_train_and_end_identical(clean_run: Path) -> None:
    assert {w: step_of(clean_run, w) for w in WORKERS} == {w: STEPS for w in WORKERS}
    first = outer_weights(clean_run, WORKERS[0])
    for worker in WORKERS:
        assert final_checkpoint(clean_run, worker).step == STEPS
        weights = outer_weights(clean_run, worker)
        assert sorted(weights) == sorted(first)
        for k in first:
            np.testing.assert_array_equal(weights[k], first[k])
        loss = column(clean_run, worker, "loss")
        assert len(loss) == STEPS and np.mean(loss[-3:]) < 0.6 * np.mean(loss[:3]), (worker, loss)


@pytest.mark.slow
def test_a_replica_killed_and_restarted_ends_bit_identical(stack3: StackHandle, clean_run: Path,
                                                           tmp_path: Path) -> None:
    """replica-1 (cluster-b) is killed -9 mid-run and restarted: it resumes from its
    checkpoint, sends again what it had sent after it (same ids, dropped by the others), and
    every replica ends bit-identical to the clean run."""
    cfgs, procs = start_job(stack3, tmp_path, "chaos")
    run_dir = tmp_path / "chaos"
    deadline = time.monotonic() + 120
    while step_of(run_dir, "replica-1") < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(procs["replica-1"].pid, signal.SIGKILL)
    procs["replica-1"].wait(30)
    assert step_of(run_dir, "replica-0") < STEPS
    procs["replica-1"] = start_worker("replica", cfgs["replica-1"], tmp_path / "chaos-replica-1.log", index=1)
    wait_all(procs, tmp_path, "chaos")
    for worker in WORKERS:
        ck = final_checkpoint(run_dir, worker)
        assert ck.step == STEPS and ck.digest == final_checkpoint(clean_run, worker).digest, worker
