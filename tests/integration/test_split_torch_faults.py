"""PyTorch halves of a split model on the real TLS stack, across federation: a torch job and a
Paddle-head/PyTorch-tail job under a WAN cut, a broker restart and a SIGKILL of each side end
bit-identical to their clean runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nebula_mq.chaos import ChaosRunner, format_report
from nebula_mq.chaos.schedule import Fault
from tests.fixtures.pairs import SPLIT_EXAMPLE

pytest.importorskip("torch")
pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow]

JOB = """
[job]
id = "{job_id}"
scenario = "split"
seed = 13
steps = 200
run_dir = "{run_dir}"
device = "cpu"

[codec]
forward = "fp16"
backward = "int8"

[split]
head = "{head}:build_head"
tail = "mlp_torch:build_tail"
head_cluster = "cluster-a"
tail_cluster = "cluster-b"
in_flight = 2
checkpoint_every = 10
lr = 0.003
"""


@pytest.mark.parametrize("head", ["mlp_torch", "mlp"], ids=["torch", "paddle-head-torch-tail"])
def test_a_torch_split_job_under_faults_ends_bit_identical_to_its_clean_run(  # type: ignore[no-untyped-def]
        stack, tmp_path: Path, head: str) -> None:
    for module in ("mlp.py", "mlp_torch.py", "mlp_data.py"):  # the user's model, next to their job file
        shutil.copy(SPLIT_EXAMPLE / module, tmp_path)
    config = tmp_path / "job.toml"
    config.write_text(JOB.format(job_id=f"torch-{head.replace('_', '-')}", run_dir=tmp_path / "run", head=head))
    # A step takes milliseconds: faults far apart, so each lands before the job outruns it; the
    # broker restart comes last (while it runs, the injector waits and the job goes on).
    schedule = [Fault(20, "cut", "", 1.5), Fault(50, "kill", "head-0", 1.0), Fault(90, "kill", "tail-0", 1.0),
                Fault(130, "restart", "cluster-b")]
    logs: list[str] = []
    try:
        report = ChaosRunner(str(config), str(stack.run_dir), schedule, log=logs.append).run(400)
    finally:
        stack.clean_wan()
    text = format_report(report) + "\n" + "\n".join(logs)
    assert report.complete and report.identical, text
    assert len(report.faults) == len(schedule), text
    # The killed workers really resumed from a checkpoint and were replayed to.
    assert report.counters["nebula_redeliveries_total"] + report.counters["nebula_duplicates_total"] > 0, text
