"""`nebula-mq study compression`: rows, auto choice, report, and a CI-sized run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nebula_mq.errors import ConfigError
from nebula_mq.study import auto, report
from nebula_mq.study.rows import BASELINE, SEQUENTIAL_BASELINE, StudyRow, beyond_paper, figure10, table5


def test_rows_follow_table5_and_figure10_notation() -> None:
    names = [r.chain for r in table5()]
    assert names[:4] == ["baseline (1 in flight)", "baseline", "FP16+INT8", "FP16(SVD(0.9))+INT8"]
    assert names[-1] == "FP16(SVD(0.2))+INT8" and len(names) == 11
    assert table5()[0].in_flight == 1 and table5()[1].in_flight == 0  # 0: the study's in_flight
    assert [r.chain for r in figure10([0, 100])] == ["FP16(SVD(0.6))+INT8 from step 100"]
    assert "DELTA(INT8)+EF(INT8)" in [r.chain for r in beyond_paper()]
    assert len({r.slug for r in table5() + beyond_paper()}) == 14  # file names never collide
    with pytest.raises(ConfigError):
        StudyRow("fp17", "int8")
    with pytest.raises(ConfigError):
        StudyRow("int8", "int8", forward_feedback="sideways")
    with pytest.raises(ConfigError):
        StudyRow("int8", "int8", in_flight=-1)


def test_auto_compresses_only_as_much_as_the_link_needs() -> None:
    shape = (16, 32, 384)
    raw_mbit = np.prod(shape) * 4 * 8 / 1e6  # one uncompressed activation, in Mbit
    # Wire of the raw tensor = 1/10 of compute: nothing to gain, keep it lossless.
    fast = auto.pick(auto.LinkProfile(rate_mbit=raw_mbit * 10, compute_s=1.0, activation_shape=shape))
    assert fast.row.forward == "none" and fast.row.backward == "none"
    # Raw wire = 3x compute: fp16 (1.5x) is not enough, int8 (~0.76x) is the least lossy that fits.
    mid = auto.pick(auto.LinkProfile(rate_mbit=raw_mbit / 3, compute_s=1.0, activation_shape=shape))
    assert mid.wire_s <= 0.9 * (1.0 + mid.codec_s)
    assert (mid.row.forward, mid.row.forward_feedback) == ("int8", "delta")
    # Raw wire = 5.5x compute: int8 both ways (~1.4x) is too much; int4 activations alone leave the
    # int8 gradients as the bound, so int4 both ways (with error feedback) is the first that fits.
    low = auto.pick(auto.LinkProfile(rate_mbit=raw_mbit / 5.5, compute_s=1.0, activation_shape=shape))
    assert (low.row.forward, low.row.backward, low.row.backward_feedback) == ("int4", "int4", "residual")
    assert low.wire_s <= 0.9 * (1.0 + low.codec_s)
    # Raw wire = 40x compute: nothing fits, so the fastest estimated step wins: int4 both ways
    # bounds the wire (shrinking activations further alone would buy nothing).
    slow = auto.pick(auto.LinkProfile(rate_mbit=raw_mbit / 40, compute_s=1.0, activation_shape=shape))
    assert slow.row.forward == "int4" and slow.row.backward == "int4"
    assert slow.wire_s == pytest.approx(40 * 0.1563, rel=0.02)  # int4: half a byte + a scale per 32, + envelope


def test_auto_never_pays_more_codec_time_than_the_wire_time_it_saves() -> None:
    """Raw wire = 3x a 1 ms compute: low-rank SVD's wire fits, but its encode and decode on this
    machine take far longer than the 3 ms of wire an uncompressed step costs, so the lossless
    chain is both faster and more accurate."""
    shape = (16, 32, 384)
    raw_mbit = np.prod(shape) * 4 * 8 / 1e6
    link = auto.LinkProfile(rate_mbit=raw_mbit / 0.003, compute_s=0.001, activation_shape=shape)
    none, svd = StudyRow("none", "none", origin="auto"), StudyRow("fp16(svd(0.2))", "int8", origin="auto")
    chosen = auto.pick(link, candidates=(none, svd))
    assert auto.estimate(svd, link, np.ones(shape, np.float32)).codec_s > 0.003  # what makes SVD lose
    assert chosen.row == none and chosen.step_s == pytest.approx(0.003, rel=0.3)


def _row(chain: StudyRow, s: float, bleu: float, comp: float, wire: float, base_s: float = 1.0) -> dict[str, object]:
    return {"chain": chain.chain, "forward_feedback": chain.forward_feedback, "s_per_step": s,
            "speedup": base_s / s, "bleu": bleu, "compute_bound_s_per_step": comp, "wire_s_per_step": wire}


def test_targets_report_what_was_met() -> None:
    delta = beyond_paper()[0]
    rows = [_row(BASELINE, 1.0, 40.0, 0.2, 0.8), _row(StudyRow("fp16(svd(0.2))", "int8"), 0.19, 30.0, 0.18, 0.1),
            _row(delta, 0.25, 39.6, 0.2, 0.2)]
    t = report.targets(rows)
    assert t["baseline"] == "baseline"  # no paper baseline in this run: the pipelined one is the reference
    assert t["best_speedup"]["met"] is True and t["best_speedup"]["chain"] == "FP16(SVD(0.2))+INT8"
    assert t["delta_speedup_at_bleu"]["met"] is True and t["delta_speedup_at_bleu"]["chain"] == delta.chain
    assert t["overlap"]["met"] is False  # 0.25 > 1.15 * 0.2
    rows[2]["bleu"] = 39.4  # more than 0.5 below the baseline
    assert report.targets(rows)["delta_speedup_at_bleu"]["met"] is False


def test_targets_are_against_the_papers_baseline_when_the_run_has_it() -> None:
    """With the paper's baseline (1 in flight) in the run, speed-ups and the BLEU bar are its;
    the pipelined baseline's own step time must still respect the overlap bound."""
    paper = _row(SEQUENTIAL_BASELINE, 2.0, 41.0, 0.2, 1.6, base_s=2.0)
    pipelined = _row(BASELINE, 0.8, 40.0, 0.2, 0.8, base_s=2.0)
    fast = _row(StudyRow("fp16(svd(0.2))", "int8"), 0.3, 30.0, 0.28, 0.1, base_s=2.0)
    delta = _row(beyond_paper()[0], 0.5, 40.8, 0.2, 0.45, base_s=2.0)
    t = report.targets([paper, pipelined, fast, delta])
    assert t["baseline"] == "baseline (1 in flight)"
    assert t["best_speedup"]["chain"] == fast["chain"] and t["best_speedup"]["speedup"] == pytest.approx(2 / 0.3)
    assert t["best_speedup"]["met"] is True
    assert t["delta_speedup_at_bleu"]["met"] is True  # 4x at 40.8 >= 41.0 - 0.5
    delta["bleu"] = 40.4  # within 0.5 of the pipelined baseline, not of the paper's
    assert t["delta_speedup_at_bleu"]["met"] is True and report.targets([paper, pipelined, fast, delta])[
        "delta_speedup_at_bleu"]["met"] is False
    assert {o["chain"] for o in t["overlap"]["rows"]} == {"baseline", fast["chain"], delta["chain"]}
    assert t["overlap"]["met"] is True
    # Against the compute time the study measured first (lockstep, both sides in turn):
    # 0.5 s/step is within 1.15 x max(0.45, 0.45 wire); the strict ratio is against 0.2 s.
    measured = report.targets([paper, pipelined, fast, delta], compute_s=0.45)["overlap"]
    row = next(o for o in measured["rows"] if o["chain"] == delta["chain"])
    assert row["met"] is True and row["ratio"] == pytest.approx(0.5 / 0.45)
    assert row["strict_ratio"] == pytest.approx(0.5 / 0.45)
    compute_bound = next(o for o in measured["rows"] if o["chain"] == fast["chain"])
    assert compute_bound["ratio"] == pytest.approx(0.3 / 0.45)
    assert compute_bound["strict_ratio"] == pytest.approx(0.3 / 0.28)  # its own slower side
    assert measured["met"] is True and measured["compute_s"] == 0.45


@pytest.mark.paddle
def test_ci_sized_study_over_the_memory_broker(tmp_path: Path) -> None:
    """Three rows, tiny preset, synthetic data: every artefact of the study is written and
    the measured ratios are those of the chains (fp16 halves, int8 quarters, delta int8 quarters)."""
    from nebula_mq.study import compression
    from nebula_mq.study.runner import MemoryLink, StudyConfig

    cfg = StudyConfig(steps=24, train_samples=64, eval_samples=16, eval_beam=2, eval_max_len=10,
                      checkpoint_every=12)
    cal = compression.calibrate(cfg, tmp_path / "runs", 4.0, steps=12)
    assert cal.compute_s > 0 and cal.activation_shape[0] == 16 and cal.activation_shape[2] == 64
    rows = [SEQUENTIAL_BASELINE, BASELINE, StudyRow("fp16", "int8"), beyond_paper()[0]]
    compared = compression.study(rows, cfg, tmp_path, "ci", MemoryLink(), cal, with_auto=False)
    by = {r["chain"]: r for r in compared}
    assert by["baseline"]["forward_ratio"] == pytest.approx(1.0, abs=0.05)
    assert by["FP16+INT8"]["forward_ratio"] == pytest.approx(0.5, abs=0.06)
    assert by["FP16+INT8"]["backward_ratio"] == pytest.approx(0.27, abs=0.04)
    assert by["DELTA(INT8)+EF(INT8)"]["forward_ratio"] == pytest.approx(0.27, abs=0.05)
    for r in compared:
        assert len(r["losses"]) == 24 and r["bleu"] is not None and r["s_per_step"] > 0
    written = [json.loads(p.read_text()) for p in tmp_path.glob("ci-*.json") if p.name != "ci-summary.json"]
    assert {w["chain"] for w in written} == set(by)
    for w in written:
        assert {"chain", "bleu", "forward_ratio", "backward_ratio", "s_per_step", "speedup"} <= set(w)
    files = sorted(p.name for p in tmp_path.glob("ci-*"))
    assert "ci-summary.json" in files and "ci-bleu-vs-speed.png" in files and "ci-loss-curves.png" in files
    assert len([f for f in files if f.endswith(".json")]) == 5
    for chain in ("FP16+INT8", "DELTA(INT8)+EF(INT8)"):  # against both baselines
        assert {"speedup", "speedup_pipelined", "bleu_p_value", "bleu_p_value_pipelined"} <= set(by[chain])
    summary = json.loads((tmp_path / "ci-summary.json").read_text())
    assert {r["chain"] for r in summary["rows"]} == set(by)
    assert "bleu_p_value" in by["FP16+INT8"]
    print(report.table(compared, "ci"))
