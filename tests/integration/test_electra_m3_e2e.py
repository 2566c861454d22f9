"""M3 on real brokers (paper Figure 4): generators on two clusters of their own, one discriminator.

The session's three-node TLS stack (``stack3``): generator 0 (multilingual MLM) on cluster-a,
generator 1 (translation pairs) on cluster-c, root and one sub-discriminator
(a gloo group of 2) on cluster-b. Each generator is its own ``nebula-mq worker``
process with its own identity, publishing ``gen-results-<k>`` across federation
and reading its own ``sync-<k>`` tokens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from nebula_mq.bench.scenario1 import electra_job
from nebula_mq.stack.layout import free_group_port
from tests.fixtures.jobs import column, final_checkpoint, start_planned, start_worker, step_of, wait_all
from tests.fixtures.stack import THREE_NODES, StackHandle

pytestmark = [pytest.mark.broker, pytest.mark.paddle, THREE_NODES]

STEPS = 24
WORKERS = {"disc-root": ("electra-root", 0), "disc-sub-1": ("electra-sub", 1),
           "gen-0": ("electra-generator", 0), "gen-1": ("electra-generator", 1)}

# Two generators of their own, on cluster-a and cluster-c, added to the bench's ELECTRA job.
GENERATORS = """
[[electra.model.generators]]
size = { hidden = 32, layers = 1, heads = 2, ffn = 64 }
lr = 2e-3
task = "mlm"
group = "north"

[[electra.model.generators]]
size = { hidden = 32, layers = 1, heads = 2, ffn = 64 }
lr = 2e-3
task = "trtd"
group = "south"
seed = 2
"""


def start_job(stack: StackHandle, tmp: Path, name: str) -> tuple[dict[str, Path], dict[str, subprocess.Popen[bytes]]]:
    # The plan: one process per generator, two discriminator ranks.
    text = electra_job("placeholder", STEPS, tmp / name, n_sub=2, port=free_group_port(2),
                       gen_clusters=("cluster-a", "cluster-c"), max_lead=2, checkpoint_every=5)
    return start_planned(stack, tmp, name, text + GENERATORS, WORKERS)



@pytest.fixture(scope="module")
def clean_run(stack3: StackHandle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("m3")
    t0 = time.monotonic()
    _, procs = start_job(stack3, tmp, "clean")
    wait_all(procs, tmp, "clean")
    (tmp / "clean-wall.txt").write_text(f"{time.monotonic() - t0:.1f}")
    return tmp / "clean"


def test_m3_generators_on_two_clusters_train_one_discriminator_in_step(clean_run: Path) -> None:
    run_dir = clean_run
    # Every process, both generators and both discriminator ranks, ends at the same step.
    assert {w: step_of(run_dir, w) for w in WORKERS} == {w: STEPS for w in WORKERS}
    for worker in WORKERS:
        assert final_checkpoint(run_dir, worker).step == STEPS
    assert final_checkpoint(run_dir, "disc-root").digest == final_checkpoint(run_dir, "disc-sub-1").digest
    rtd = column(run_dir, "disc-root", "rtd_loss")
    assert len(rtd) == STEPS and np.mean(rtd[-6:]) < np.mean(rtd[:6]) - 0.05, rtd
    for gen in ("gen-0", "gen-1"):
        mlm = column(run_dir, gen, "mlm_loss")
        assert len(mlm) == STEPS and np.mean(mlm[-6:]) < np.mean(mlm[:6]), (gen, mlm)
        # Each generator ran at most max_lead steps past its own last sync token.
        assert all(step - s <= 3 for step, s in enumerate(column(run_dir, gen, "synced"), start=1))


@pytest.mark.slow
def test_m3_generator_killed_and_restarted_ends_bit_identical(
        stack3: StackHandle, clean_run: Path, tmp_path: Path) -> None:
    """gen-1 (cluster-c) is killed -9 mid-run and restarted: it resumes from its checkpoint,
    recomputes micro-batches the root deduplicates, and every process ends bit-identical
    to the clean run, gen-0 (which kept running) included."""
    cfgs, procs = start_job(stack3, tmp_path, "chaos")
    run_dir = tmp_path / "chaos"
    deadline = time.monotonic() + 120
    while step_of(run_dir, "gen-1") < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(procs["gen-1"].pid, signal.SIGKILL)
    procs["gen-1"].wait()
    assert step_of(run_dir, "disc-root") < STEPS
    procs["gen-1"] = start_worker("electra-generator", cfgs["gen-1"], tmp_path / "chaos-gen-1.log", index=1)
    wait_all(procs, tmp_path, "chaos")
    for worker in WORKERS:
        ck = final_checkpoint(run_dir, worker)
        assert ck.step == STEPS and ck.digest == final_checkpoint(clean_run, worker).digest, worker
