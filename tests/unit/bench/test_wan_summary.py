"""``bench wan --repeats``: each WAN row's ratio is taken against the in-cluster row of its own
repeat, and the table shows the medians."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nebula_mq.bench.wan import codec_sets, plan, row_env
from nebula_mq.bench.wan_report import summary
from nebula_mq.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def _row(name: str, repeat: int, sps: float, rate: float | None = 10.0, loss: float = 6.0) -> dict[str, Any]:
    return {"row": name, "repeat": repeat, "rate_mbit": rate, "delay_ms": None if rate is None else 20.0,
            "samples_per_s": sps, "step_s_median": 16 / sps, "final_loss": loss,
            "compute_share": {"enc-0": 0.5 + repeat / 10, "dec-0": 0.8}}


def test_each_ratio_is_against_its_own_repeats_in_cluster_row() -> None:
    rows = [_row("in-cluster", 0, 100.0, None), _row("10mbit-20ms", 0, 95.0),
            _row("in-cluster", 1, 80.0, None), _row("10mbit-20ms", 1, 80.0),
            _row("in-cluster", 2, 120.0, None), _row("10mbit-20ms", 2, 90.0)]
    table = summary(rows)
    assert [t["row"] for t in table] == ["in-cluster", "10mbit-20ms"]
    wan = table[1]
    assert wan["ratios"] == pytest.approx([0.95, 1.0, 0.75])
    assert wan["ratio"] == pytest.approx(0.95)  # not median(95, 80, 90) / median(100, 80, 120) = 0.9
    assert wan["samples_per_s"] == 90.0
    assert wan["compute_share"] == {"enc-0": pytest.approx(0.6), "dec-0": 0.8}
    assert table[0]["ratios"] == [1.0, 1.0, 1.0]


def test_busy_is_the_in_cluster_rows_busiest_workers_share_against_its_own_repeat() -> None:
    rows = [_row("in-cluster", 0, 100.0, None), {**_row("10mbit-100ms", 0, 120.0), "compute_share": {"enc-0": 0.9, "dec-0": 0.72}},
            _row("in-cluster", 1, 80.0, None), {**_row("10mbit-100ms", 1, 70.0), "compute_share": {"enc-0": 0.2, "dec-0": 0.8}}]
    wan = summary(rows)[1]
    # dec-0 bounds the pipeline in one cluster (0.8 against enc-0's 0.5 and 0.6): its share
    # is compared, whatever enc-0 did and whatever the host's speed did to samples/s.
    assert wan["busy_ratios"] == pytest.approx([0.9, 1.0])
    assert wan["busy_ratio"] == pytest.approx(0.95)
    assert wan["ratios"] == pytest.approx([1.2, 0.875])


def test_a_model_that_differs_between_repeats_shows_every_final_loss() -> None:
    rows = [_row("in-cluster", 0, 100.0, None), _row("10mbit-20ms", 0, 95.0, loss=6.0),
            _row("in-cluster", 1, 100.0, None), _row("10mbit-20ms", 1, 95.0, loss=6.5)]
    assert summary(rows)[1]["final_losses"] == [6.0, 6.5]


def test_repeats_below_one_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from nebula_mq.cli import main

    code = main(["bench", "wan", str(ROOT / "config" / "demo.toml"), "--repeats", "0"])
    err = capsys.readouterr().err
    assert code != 0 and "--repeats" in err and "Traceback" not in err


def test_a_fractional_rate_makes_a_valid_job_id(tmp_path: Path) -> None:
    from workers.registry import load_job_settings

    settings = load_job_settings(str(ROOT / "config" / "demo.toml"))
    env = row_env(settings, "2.7mbit-20ms-r0", 40, tmp_path, local=False)
    assert env["NEBULA__JOB__ID"] == "demo-wan-2p7mbit-20ms-r0"
    assert env["NEBULA__ABNET__EVAL_SAMPLES"] == "0"  # the rows time training, not a beam search
    reloaded = load_job_settings(str(ROOT / "config" / "demo.toml"), environ=env)
    assert reloaded.job.id == "demo-wan-2p7mbit-20ms-r0" and reloaded.job.steps == 40
    local = row_env(settings, "in-cluster", 40, tmp_path, local=True)
    assert local["NEBULA__ABNET__TAIL_CLUSTER"] == "cluster-a"


def test_every_repeat_starts_in_one_cluster_and_turns_the_wan_rows_round() -> None:
    order = [(repeat, name) for repeat, name, _, _, _ in plan([10.0, 60.0], [20.0], 3)]
    assert order == [(0, "in-cluster"), (0, "10mbit-20ms"), (0, "60mbit-20ms"),
                     (1, "in-cluster"), (1, "60mbit-20ms"), (1, "10mbit-20ms"),
                     (2, "in-cluster"), (2, "10mbit-20ms"), (2, "60mbit-20ms")]
    assert plan([2.7], [0.0], 1) == [(0, "in-cluster", None, None, None), (0, "2.7mbit-0ms", 2.7, 0.0, "job")]


def test_uncompressed_and_auto_rows_share_one_in_cluster_row_per_repeat() -> None:
    rows = plan([2.7], [20.0, 100.0], 2, codec_sets("none,auto"))
    assert [(r, name, chains) for r, name, _, _, chains in rows] == [
        (0, "in-cluster", None), (0, "2.7mbit-20ms-none", "none"), (0, "2.7mbit-20ms-auto", "auto"),
        (0, "2.7mbit-100ms-none", "none"), (0, "2.7mbit-100ms-auto", "auto"),
        (1, "in-cluster", None), (1, "2.7mbit-100ms-auto", "auto"), (1, "2.7mbit-100ms-none", "none"),
        (1, "2.7mbit-20ms-auto", "auto"), (1, "2.7mbit-20ms-none", "none")]
    assert [name for _, name, _, _, _ in plan([60.0], [20.0], 1, ["auto"])] == ["in-cluster", "60mbit-20ms"]
    # The job's own chains beside uncompressed: one in-cluster row, then both at each link.
    assert [(name, chains) for _, name, _, _, chains in plan([0.6], [20.0], 1, codec_sets("none,job"))] == [
        ("in-cluster", None), ("0.6mbit-20ms-none", "none"), ("0.6mbit-20ms-job", "job")]


@pytest.mark.parametrize("text", ["", "zip", "job,auto", "auto,auto", "none,fp16", "job,job", "none,auto,job"])
def test_codec_sets_other_than_job_none_and_auto_are_one_line_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="--codecs"):
        codec_sets(text)


def test_the_report_names_a_full_link_and_not_the_window_beneath_it() -> None:
    from types import SimpleNamespace

    from nebula_mq.bench.wan_report import report

    settings = SimpleNamespace(job=SimpleNamespace(id="langid"), codec=SimpleNamespace(forward="fp16", backward="int8"),
                               scenario_section=lambda: {"in_flight": 12})
    # The H200's numbers: a 14.4 ms step in one cluster; fp16 activations take 26 ms of wire a
    # step at 60 Mbit/s, int8 ones 13 ms.
    inside = {**_row("in-cluster", 0, 2229.0, None), "samples": 32 * 400, "step_s_median": 0.0144}
    full = {**_row("60mbit-20ms", 0, 1216.0, 60.0), "busiest_bytes_per_step": 196_608.0}
    fits = {**_row("60mbit-5ms", 0, 1900.0, 60.0), "delay_ms": 5.0, "busiest_bytes_per_step": 98_304.0}
    rows = [inside, full, fits]
    notes = [line for line in report(settings, rows, 400, 80).splitlines() if line.startswith("note:")]
    assert len(notes) == 2
    assert notes[0].startswith("note: 60mbit-20ms: the link is full") and "deeper window" in notes[0]
    assert notes[1].startswith("note: 60mbit-5ms: 0.85x the samples/s")  # it fits: the window is named


def test_the_full_links_bound_is_never_below_what_the_row_measured() -> None:
    """This host's 60-minute job: a 0.564 s median step, but 34.3 samples/s of 32 (0.93 s a step);
    R32 took 16.2 samples/s across 0.6 Mbit/s, 0.47x. The bound must allow that."""
    import re
    from types import SimpleNamespace

    from nebula_mq.bench.wan_report import report

    settings = SimpleNamespace(job=SimpleNamespace(id="abnet-corpus"), codec=SimpleNamespace(forward="f", backward="b"),
                               scenario_section=lambda: {"in_flight": 4})
    inside = {**_row("in-cluster", 0, 34.3, None), "samples": 32 * 24, "step_s_median": 0.564}
    slow = {**_row("0.6mbit-20ms", 0, 16.2, 0.6), "busiest_bytes_per_step": 130_600.0}
    note = next(line for line in report(settings, [inside, slow], 24, 6).splitlines() if line.startswith("note:"))
    bound = float(re.search(r"at most ([0-9.]+)x", note).group(1))  # type: ignore[union-attr]
    assert "the link is full" in note and 16.2 / 34.3 <= bound <= 0.6


def test_an_in_cluster_row_without_metrics_leaves_busy_unknown_not_a_crash() -> None:
    rows = [{**_row("in-cluster", 0, 100.0, None), "compute_share": {}}, _row("10mbit-20ms", 0, 95.0)]
    wan = summary(rows)[1]
    assert wan["ratio"] == pytest.approx(0.95) and wan["busy_ratio"] != wan["busy_ratio"]  # NaN
