"""PyTorch halves of a split model on the real TLS stack, across federation: a torch job and a
Paddle-head/PyTorch-tail job, each under a WAN cut and a SIGKILL of each side, end bit-identical
to their clean runs, and what each run trained exports and predicts the same. (Broker restarts
touch the transport only, the same for every framework: test_chaos.py and test_soak.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from nebula_mq.chaos import Fault
from tests.fixtures.jobs import copy_split_example, run_chaos, split_job
from tests.fixtures.lanes import CPU_HEAVY

pytest.importorskip("torch")
pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow, CPU_HEAVY]


@pytest.mark.parametrize("head", ["mlp_torch", "mlp"], ids=["torch", "paddle-head-torch-tail"])
def test_a_torch_split_job_under_faults_ends_bit_identical_to_its_clean_run(  # type: ignore[no-untyped-def]
        stack, tmp_path: Path, head: str) -> None:
    copy_split_example(tmp_path)  # the user's model, next to their job file
    config = tmp_path / "job.toml"
    config.write_text(split_job(f"torch-{head.replace('_', '-')}", tmp_path / "run", seed=13, head=head,
                                tail="mlp_torch"))
    # A step takes milliseconds: faults far apart, so each lands before the job outruns it. The
    # kills are what each job adds: each framework's restore from a checkpoint.
    schedule = [Fault(20, "cut", "", 1.5), Fault(50, "kill", "head-0", 1.0), Fault(90, "kill", "tail-0", 1.0)]
    report, text, _logs = run_chaos(stack, config, schedule, 400)
    assert report.complete and report.identical, text
    assert len(report.faults) == len(schedule), text
    # The killed workers really resumed from a checkpoint and were replayed to.
    assert report.counters["nebula_redeliveries_total"] + report.counters["nebula_duplicates_total"] > 0, text

    # What the faulted run trained is usable: exported in each side's format, and predict runs
    # head then tail to the outputs the clean run's halves give (the weights are bit-identical).
    import dataclasses
    import sys

    import numpy as np

    from nebula_mq.settings import load_settings
    from workers.split import export, predict

    sys.path.insert(0, str(tmp_path))  # the job's model modules, as the builders import them
    import mlp_data

    x, _ = mlp_data.dataset()
    inputs = [x[mlp_data.batch_ids(7)]]
    outputs = {}
    for run in ("clean", "chaos"):
        base = load_settings(config)
        settings = dataclasses.replace(base, job=dataclasses.replace(base.job, run_dir=str(tmp_path / "run" / run)))
        manifest = export(settings, tmp_path / "export" / run)
        assert manifest["step"] == 200 and manifest["sides"]["tail"]["file"] == "tail.pt", manifest
        assert manifest["sides"]["head"]["checkpoint_digest"] == report.digests["head-0"][0 if run == "clean" else 1]
        outputs[run] = predict(settings, inputs)
    np.testing.assert_array_equal(outputs["clean"], outputs["chaos"])
