"""Scenario I end to end on real brokers: generator on cluster-a; root and one
sub-discriminator (a gloo group of 2) on cluster-b; micro-batches cross TLS
federation through the WAN relay, sync tokens come back.

Workers run as separate ``nebula-mq worker`` processes configured from a job
file that names their brokers, as in a real deployment.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nebula_mq.bench.scenario1 import electra_job
from nebula_mq.stack.layout import free_group_port
from tests.fixtures.jobs import (column, final_checkpoint, provision_job_files, start_worker, step_of, wait_all,
                                 wait_steps)

# One worker runs the module, so the clean run (a module fixture) is made once.
pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.xdist_group("electra-e2e")]

WORKERS = ("electra-root", "electra-sub", "electra-generator")
STEPS = 30


def write_job(stack: Any, tmp: Path, name: str, steps: int, n_sub: int = 2,
              gen_cluster: str = "cluster-a") -> dict[str, Path]:
    """Provision a job on the test stack; one job file per process (worker id -> path)."""
    text = electra_job("placeholder", steps, tmp / name, n_sub=n_sub, port=free_group_port(n_sub),
                       gen_clusters=(gen_cluster,), max_lead=2, checkpoint_every=5)
    return provision_job_files(stack, tmp, name, text)


start = start_worker


def start_all(cfgs: dict[str, Path], tmp: Path, name: str) -> dict[str, subprocess.Popen[bytes]]:
    return {"disc-root": start("electra-root", cfgs["disc-root"], tmp / f"{name}-root.log"),
            "disc-sub-1": start("electra-sub", cfgs["disc-sub-1"], tmp / f"{name}-sub.log", index=1),
            "gen": start("electra-generator", cfgs["gen"], tmp / f"{name}-gen.log")}



final = final_checkpoint


@pytest.fixture(scope="module")
def clean(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run: checked by the first test, the reference of the faulted ones."""
    tmp = tmp_path_factory.mktemp("electra")
    cfg = write_job(stack, tmp, "clean", STEPS)
    wait_all(start_all(cfg, tmp, "clean"), tmp, "clean", 240)
    return tmp / "clean"


def test_electra_across_federation_trains_in_step_with_a_data_parallel_discriminator(clean: Path) -> None:
    steps, run_dir = STEPS, clean
    # Both sides (and both discriminator ranks) end at the same step.
    assert step_of(run_dir, "gen") == step_of(run_dir, "disc-root") == step_of(run_dir, "disc-sub-1") == steps
    for worker in ("gen", "disc-root", "disc-sub-1"):
        assert final(run_dir, worker).step == steps
    # Data parallelism: the two ranks hold bit-identical parameters and optimiser state.
    assert final(run_dir, "disc-root").digest == final(run_dir, "disc-sub-1").digest
    rtd, mlm = column(run_dir, "disc-root", "rtd_loss"), column(run_dir, "gen", "mlm_loss")
    assert len(rtd) == len(mlm) == steps
    assert np.mean(rtd[-6:]) < np.mean(rtd[:6]) - 0.05, rtd
    assert np.mean(mlm[-6:]) < np.mean(mlm[:6]) - 0.3, mlm
    # The generator never ran more than max_lead steps past the last sync token.
    synced = column(run_dir, "gen", "synced")
    assert all(step - s <= 3 for step, s in enumerate(synced, start=1))


@pytest.mark.slow
def test_electra_generator_killed_and_restarted_ends_bit_identical(stack: Any, tmp_path: Path, clean: Path) -> None:
    steps = STEPS
    cfg = write_job(stack, tmp_path, "chaos", steps)
    run_dir = tmp_path / "chaos"
    procs = start_all(cfg, tmp_path, "chaos")
    wait_steps(run_dir, 8, ["gen"])
    os.kill(procs["gen"].pid, signal.SIGKILL)
    procs["gen"].wait()
    procs["gen"] = start("electra-generator", cfg["gen"], tmp_path / "chaos-gen.log")
    wait_all(procs, tmp_path, "chaos", 240)
    for worker in ("gen", "disc-root", "disc-sub-1"):
        assert final(run_dir, worker).step == steps
        assert final(run_dir, worker).digest == final(clean, worker).digest, worker


@pytest.mark.slow
def test_electra_sub_discriminator_crash_restarts_the_group_from_its_checkpoint(
        stack: Any, tmp_path: Path, clean: Path) -> None:
    """A rank killed -9 stalls the others in the next collective; the group (root + subs)
    is restarted together, agrees on the last common checkpoint, the root re-scatters what
    came after it, and the run ends bit-identical to an uninterrupted one."""
    steps = STEPS
    cfg = write_job(stack, tmp_path, "crash", steps)
    run_dir = tmp_path / "crash"
    procs = start_all(cfg, tmp_path, "crash")
    wait_steps(run_dir, 8, ["disc-sub-1"])
    for worker in ("disc-sub-1", "disc-root"):  # the root would only time out in the all-reduce
        os.kill(procs[worker].pid, signal.SIGKILL)
        procs[worker].wait()
    assert step_of(run_dir, "disc-root") < steps
    procs["disc-root"] = start("electra-root", cfg["disc-root"], tmp_path / "crash-root.log")
    procs["disc-sub-1"] = start("electra-sub", cfg["disc-sub-1"], tmp_path / "crash-sub.log", index=1)
    wait_all(procs, tmp_path, "crash", 240)
    for worker in ("gen", "disc-root", "disc-sub-1"):
        assert final(run_dir, worker).step == steps
        assert final(run_dir, worker).digest == final(clean, worker).digest, worker
