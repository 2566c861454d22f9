"""`nebula-mq chaos` at tiny scale: five WAN cuts, a broker restart, a SIGKILL on
each side and a consumer stall; the faulted run must end bit-identical to the
clean one, with every worker at the last step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nebula_mq.chaos import ChaosRunner, default_schedule, format_report

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow]

JOB = """
[job]
id = "chaostest"
scenario = "abnet"
seed = 5
steps = 150
run_dir = "{run_dir}"

[codec]
forward = "fp16(svd(0.6))"
backward = "int8"

[abnet]
preset = "tiny"
batch_size = 8
in_flight = 3
lr = 0.01
checkpoint_every = 4
src_cluster = "cluster-a"
tgt_cluster = "cluster-b"
"""


def test_chaos_run_ends_bit_identical_to_clean_run(stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "job.toml"
    config.write_text(JOB.format(run_dir=tmp_path / "run"))
    schedule = default_schedule(150, ("cluster-a", "cluster-b"), ("enc-0", "dec-0"),
                                cut_s=(1, 1, 2, 2, 3), stall_s=5)
    kinds = [f.kind for f in schedule]
    assert kinds.count("cut") == 5 and kinds.count("restart") == 1 and kinds.count("kill") == 2
    try:
        report = ChaosRunner(str(config), str(stack.run_dir), schedule, log=lambda _m: None).run(600)
    finally:
        stack.clean_wan()
    text = format_report(report)
    assert report.complete, text
    assert report.identical, text
    assert len(report.faults) == len(schedule)
    # The workers really were disturbed: the killed ones were replayed to.
    assert report.counters["nebula_redeliveries_total"] + report.counters["nebula_duplicates_total"] > 0, text
    faults = [json.loads(line) for line in (tmp_path / "run" / "chaos" / "faults.jsonl").read_text().splitlines()]
    assert [f["kind"] for f in faults] == kinds
