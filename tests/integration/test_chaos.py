"""`nebula-mq chaos` at tiny scale: five WAN cuts, a broker restart, a SIGKILL on
each side and a consumer stall; the faulted run must end bit-identical to the
clean one, with every worker at the last step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nebula_mq.chaos import ChaosRunner, default_schedule, format_report
from tests.fixtures.jobs import ABNET_JOB
from tests.fixtures.lanes import CPU_HEAVY

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow, CPU_HEAVY]

STEPS = 60
JOB = ABNET_JOB.format(job_id="chaostest", seed=5, steps=STEPS, run_dir="{run_dir}", batch_size=8, extra="")


def test_chaos_run_ends_bit_identical_to_clean_run(stack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "job.toml"
    config.write_text(JOB.format(run_dir=tmp_path / "run"))
    schedule = default_schedule(STEPS, ("cluster-a", "cluster-b"), ("enc-0", "dec-0"),
                                cut_s=(1, 1, 1, 1, 2), stall_s=2)
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




def test_chaos_kills_a_discriminator_rank_with_its_group_and_ends_bit_identical(  # type: ignore[no-untyped-def]
        stack, tmp_path: Path) -> None:
    """A gloo rank restarted alone waits for ever in the rendezvous: chaos kills the
    root and restarts the whole discriminator group with it."""
    from nebula_mq.chaos import Fault
    from nebula_mq.bench.scenario1 import electra_job
    from nebula_mq.stack.layout import free_group_port

    config = tmp_path / "electra.toml"
    config.write_text(electra_job("chaos-electra", 25, tmp_path / "run", n_sub=2, port=free_group_port(2),
                                  gen_clusters=("cluster-a",), max_lead=2, checkpoint_every=5))
    logs: list[str] = []
    report = ChaosRunner(str(config), str(stack.run_dir), [Fault(8, "kill", "disc-root", 0.5)],
                         log=logs.append).run(300)
    text = format_report(report)
    assert report.complete and report.identical, text + "\n" + "\n".join(logs)
    assert any("disc-root, disc-sub-1" in line for line in logs), logs
    assert set(report.digests) == {"disc-root", "disc-sub-1", "gen"}


def test_a_chaos_run_past_its_timeout_ends_with_a_report_not_a_traceback(  # type: ignore[no-untyped-def]
        stack, tmp_path: Path) -> None:
    config = tmp_path / "job.toml"
    config.write_text(JOB.format(run_dir=tmp_path / "run").replace('id = "chaostest"', 'id = "chaos-timeout"'))
    report = ChaosRunner(str(config), str(stack.run_dir), [], log=lambda _m: None).run(3)
    text = format_report(report)
    assert report.timed_out == "clean run" and not report.complete, text
    assert "TIMED OUT" in text and "lost: SOME" in text
    assert json.loads((tmp_path / "run" / "chaos" / "chaos.json").read_text())["complete"] is False
