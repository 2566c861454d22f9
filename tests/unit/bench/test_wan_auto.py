"""``bench wan --codecs auto``: what the uncompressed in-cluster row measured decides each WAN
row's chains, by the study's rule, and a split job is never given ABNet's feedback."""

from __future__ import annotations

from pathlib import Path

import pytest

from nebula_mq.bench.wan import AutoCodecs, Profile, pick, profile, row_codecs, uncompressed
from workers.registry import load_job_settings

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "config" / "demo.toml"
SPLIT = ROOT / "examples" / "split_mlp" / "job.toml"


def _metrics(run_dir: Path, worker: str, out_bytes: float, in_bytes: float) -> None:
    (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics" / f"{worker}.prom").write_text(
        "# TYPE nebula_wire_bytes counter\n"
        f'nebula_wire_bytes_total{{flow="fwd",direction="out"}} {out_bytes}\n'
        f'nebula_wire_bytes_total{{flow="bwd",direction="in"}} {in_bytes}\n')


# 100 steps of 16: 0.15 s a step after the warm-up (the median step is shorter: long batches are rare).
MEASURED = {"samples_per_s": 16 / 0.15, "step_s_median": 0.1, "compute_share": {"enc-0": 0.6, "dec-0": 0.8},
            "samples": 1600}


def test_the_profile_is_the_slower_side_in_the_steady_state_and_each_sides_published_bytes(tmp_path: Path) -> None:
    settings = load_job_settings(str(DEMO))  # batch 16, preset small (hidden 384)
    seq = 8
    forward = 16 * seq * 384 * 4 + 16 * seq + 16 * 8  # float32 activations, int8 mask, int64 ids
    _metrics(tmp_path, "enc-0", out_bytes=100 * forward, in_bytes=5e6)
    _metrics(tmp_path, "dec-0", out_bytes=100 * 196_608, in_bytes=1e6)
    found = profile(settings, tmp_path, 100, ["enc-0"], ["dec-0"], MEASURED)
    assert found.compute_s == pytest.approx(0.12)  # the rate's step x the busier side's share
    assert found.forward_bytes == pytest.approx(forward)  # the bytes it received are not counted
    assert found.backward_bytes == pytest.approx(196_608)
    assert found.shape == (16, seq, 384)
    # The larger direction (the forward's 196,864 B) at 1 Mbit/s is 1.57 s: 13x the 0.12 s of compute.
    assert found.wire_factor(1.0) == pytest.approx(forward * 8 / 1e6 / 0.12)


def test_a_fast_link_sends_raw_and_a_slow_one_compresses() -> None:
    settings = load_job_settings(str(DEMO))
    found = Profile(compute_s=0.12, forward_bytes=196_000, backward_bytes=196_000, shape=(16, 8, 384))
    assert pick(settings, found, 10_000.0).row == uncompressed()
    slow = pick(settings, found, 3.0).row  # 196 kB at 3 Mbit/s: 0.52 s, 4.4x the compute
    assert slow.forward != "none" and slow.backward != "none"
    env = row_codecs(settings, slow)
    assert env["NEBULA__CODEC__FORWARD"] == slow.forward
    assert env["NEBULA__ABNET__FORWARD_FEEDBACK"] == slow.forward_feedback


def test_a_split_job_is_never_given_feedback() -> None:
    settings = load_job_settings(str(SPLIT))
    found = Profile(compute_s=0.01, forward_bytes=1e6, backward_bytes=1e6, shape=(32, 1, 7812))
    row = pick(settings, found, 1.0).row  # wire 8 s a step: the smallest chain it may use
    assert row.forward_feedback == row.backward_feedback == "none"
    assert set(row_codecs(settings, row)) == {"NEBULA__CODEC__FORWARD", "NEBULA__CODEC__BACKWARD",
                                              "NEBULA__CODEC__COMPRESS_FROM_STEP"}


def test_the_in_cluster_row_is_uncompressed_and_the_wan_rows_wait_for_it(tmp_path: Path) -> None:
    settings = load_job_settings(str(DEMO))
    codecs = AutoCodecs(settings)
    assert row_codecs(settings, codecs.choice(None)) == {
        "NEBULA__CODEC__FORWARD": "none", "NEBULA__CODEC__BACKWARD": "none", "NEBULA__CODEC__COMPRESS_FROM_STEP": "0",
        "NEBULA__ABNET__FORWARD_FEEDBACK": "none", "NEBULA__ABNET__BACKWARD_FEEDBACK": "none"}
    with pytest.raises(RuntimeError):
        codecs.choice(10.0)
    _metrics(tmp_path, "enc-0", out_bytes=100 * 196_000, in_bytes=0)
    _metrics(tmp_path, "dec-0", out_bytes=100 * 196_000, in_bytes=0)
    codecs.learn(profile(settings, tmp_path, 100, ["enc-0"], ["dec-0"], MEASURED))
    chosen = codecs.choice(3.0)
    assert chosen is codecs.choice(3.0) and chosen != uncompressed()  # picked once, kept for every repeat
    notes = codecs.notes()
    assert "auto at 3 Mbit/s" in notes[-1] and chosen.chain in notes[-1]


def test_a_row_that_measured_nothing_is_a_one_line_error(tmp_path: Path) -> None:
    from nebula_mq.errors import WorkerError

    settings = load_job_settings(str(DEMO))
    _metrics(tmp_path, "enc-0", out_bytes=0, in_bytes=0)
    with pytest.raises(WorkerError, match="neither auto's chains nor a wire factor"):
        profile(settings, tmp_path, 100, ["enc-0"], ["dec-0"], {**MEASURED, "compute_share": {}})
