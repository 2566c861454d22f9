"""Data-parallel ranks on both sides of a split model (``[split]``/``[abnet]`` head_ranks x
tail_ranks), on the real TLS stack: every micro-batch cut into 2 x 2 pieces, each side a
gloo group of two processes."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from nebula_mq.chaos import Fault
from nebula_mq.launch import JobProcesses
from nebula_mq.stack.layout import free_group_port
from tests.fixtures.jobs import (ABNET_JOB, column, copy_split_example, final_checkpoint, finish, run_chaos,
                                 run_to_end, split_job)
from tests.fixtures.lanes import CPU_HEAVY

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow, CPU_HEAVY]


def model_arrays(run_dir: Path, worker: str) -> dict[str, np.ndarray]:
    """A worker's weights and optimizer state (not its per-peer compression state)."""
    arrays = final_checkpoint(run_dir, worker).arrays
    return {k: v for k, v in arrays.items() if "/param/" in k or "/opt/" in k}


# The torch example's MLP without dropout: a rank other than 0 draws its own dropout masks, so
# only a model without dropout trains exactly the 1 x 1 model on ranks.
TORCH_EXACT = """
from mlp_torch import build_head as _head, build_tail as _tail

def build_head(settings):
    return _head(settings, dropout=0.0)

def build_tail(settings):
    return _tail(settings, dropout=0.0)
"""


def test_2x2_torch_ranks_train_the_1x1_model_with_identical_ranks(  # type: ignore[no-untyped-def]
        stack, tmp_path: Path) -> None:
    """The same global batch, in_flight 1, no compression: 2 x 2 ranks in torch.distributed
    groups end where one head and one tail end (to float tolerance), and the ranks of a side
    hold the same weights. Paddle's gloo groups are held to the same check by
    test_four_hosts.py's 2 x 2 job, every rank on a host of its own."""
    module = "torch_exact"
    copy_split_example(tmp_path)  # the user's model, next to their job file
    (tmp_path / "torch_exact.py").write_text(TORCH_EXACT)
    runs = {}
    for heads, tails in ((1, 1), (2, 2)):
        name = f"split{heads}x{tails}"
        config = tmp_path / f"{name}.toml"
        port = free_group_port(8)
        ranks = (f"head_ranks = {heads}\ntail_ranks = {tails}\nhead_gloo_port = {port}\n"
                 f"tail_gloo_port = {port + 4}\ngroup_timeout_s = 60")
        config.write_text(split_job(f"ranks-{name}", tmp_path / name, steps=20, head=module, tail=module,
                                    forward="none", backward="none", in_flight=1, checkpoint_every=5, extra=ranks))
        run_to_end(config, stack.run_dir)
        runs[(heads, tails)] = tmp_path / name
    one, four = runs[(1, 1)], runs[(2, 2)]
    for ranks in (("head-0", "head-0-r1"), ("tail-0", "tail-0-r1")):
        a, b = (model_arrays(four, w) for w in ranks)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), ranks
        single = model_arrays(one, ranks[0])
        assert single.keys() == a.keys()
        for k in single:
            np.testing.assert_allclose(a[k], single[k], rtol=2e-4, atol=2e-5, err_msg=k)
    # The global loss each step (the head's record: the mean over the tail ranks) is 1 x 1's.
    np.testing.assert_allclose(column(four, "head-0", "loss"), column(one, "head-0", "loss"), rtol=1e-4)
    losses = column(four, "tail-0-r1", "loss")
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses


def test_2x2_abnet_under_chaos_ends_bit_identical_to_a_clean_2x2_run(stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A WAN cut, a broker restart, and SIGKILL of one rank on each side (its group is
    restarted from the group's lowest common checkpoint)."""
    config = tmp_path / "job.toml"
    port = free_group_port(8)
    ranks = (f"encoder_ranks = 2\ndecoder_ranks = 2\nhead_gloo_port = {port}\ntail_gloo_port = {port + 4}\n"
             "group_timeout_s = 60")
    total = 24
    config.write_text(ABNET_JOB.format(job_id="ranks-chaos", seed=5, steps=total, run_dir=tmp_path / "run",
                                       batch_size=8, extra=ranks))
    schedule = [Fault(4, "cut", "", 2.0), Fault(8, "kill", "enc-0-r1", 0.5),
                Fault(12, "restart", "cluster-b"), Fault(16, "kill", "dec-0", 0.5)]
    report, text, logs = run_chaos(stack, config, schedule, 420)
    assert set(report.digests) == {"enc-0", "enc-0-r1", "dec-0", "dec-0-r1"}, text
    assert report.complete and report.identical, text
    assert len(report.faults) == len(schedule), text
    assert any("enc-0, enc-0-r1" in line for line in logs) and any("dec-0, dec-0-r1" in line for line in logs), logs
    clean = tmp_path / "run" / "clean"
    for ranks in (("enc-0", "enc-0-r1"), ("dec-0", "dec-0-r1")):
        a, b = (model_arrays(clean, w) for w in ranks)
        assert all(np.array_equal(a[k], b[k]) for k in a), ranks
    losses = column(clean, "dec-0", "loss")
    assert np.mean(losses[-8:]) < np.mean(losses[:8]), losses
    assert report.counters["nebula_redeliveries_total"] + report.counters["nebula_duplicates_total"] > 0, text
    faults = [json.loads(line) for line in (tmp_path / "run" / "chaos" / "faults.jsonl").read_text().splitlines()]
    assert [f["kind"] for f in faults] == ["cut", "kill", "restart", "kill"]

    # SIGTERM to every rank (what `nebula-mq run` sends on Ctrl-C): each group stops at one step
    # boundary, every rank exits 0, and running again ends bit-identical to the clean run too.
    stopped = JobProcesses(str(config), str(stack.run_dir), env={
        "NEBULA__JOB__ID": "ranks-stop", "NEBULA__JOB__RUN_DIR": str(tmp_path / "run" / "stop")})
    stopped.provision()
    stopped.start_all()
    deadline = time.monotonic() + 120
    while stopped.slowest_step() < 8 and stopped.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    stopped.signal_all(signal.SIGTERM)
    finish(stopped, 60)
    steps = stopped.steps()
    assert steps["enc-0"] == steps["enc-0-r1"] < total and steps["dec-0"] == steps["dec-0-r1"] < total, steps
    stopped.start_all()
    finish(stopped, 240)
    for worker, (clean_digest, _) in report.digests.items():
        assert final_checkpoint(stopped.run_dir, worker).digest == clean_digest, worker
