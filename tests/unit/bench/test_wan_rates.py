"""``bench wan --rates 4x``: a link set by the paper's regime (the uncompressed wire 4 times the
compute in one cluster) rather than in Mbit/s, so the regime follows the host's speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from nebula_mq.bench.wan_auto import Profile
from nebula_mq.bench.wan_rates import WireFactor, factor_notes, link_rates, resolve
from nebula_mq.bench.wan_ratio import codec_sets, plan, row_env
from nebula_mq.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
# 750 kB of activations and 500 kB of gradients a step, 0.5 s of compute on the busier side.
FOUND = Profile(compute_s=0.5, forward_bytes=750_000, backward_bytes=500_000, shape=(32, 61, 384))


def test_rates_are_mbit_or_wire_factors() -> None:
    assert link_rates("10, 2.7,4x") == [10.0, 2.7, WireFactor(4.0)]
    assert link_rates("0.5x") == [WireFactor(0.5)]


@pytest.mark.parametrize("text", ["", ",", "x", "4y", "-1", "0", "0x", "inf", "nanx", "4xx", "x4"])
def test_anything_else_is_a_one_line_error_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match="--rates"):
        link_rates(text)


def test_a_factor_is_the_rate_at_which_the_slower_directions_wire_takes_that_many_computes() -> None:
    rate = resolve(WireFactor(4.0), FOUND)
    assert rate == pytest.approx(3.0)  # 750 kB x 8 bits over 4 x 0.5 s
    assert FOUND.wire_factor(rate) == pytest.approx(4.0)
    slower = Profile(compute_s=0.7, forward_bytes=750_000, backward_bytes=500_000, shape=(32, 61, 384))
    assert resolve(WireFactor(4.0), slower) == 2.14  # 2.142857: three figures, as a link is written
    assert resolve(60.0, FOUND) == 60.0 and resolve(60.0, None) == 60.0
    with pytest.raises(RuntimeError):  # only from an in-cluster row
        resolve(WireFactor(4.0), None)
    (note,) = factor_notes([10.0, WireFactor(4.0)], FOUND)
    assert note.startswith("4x: 3 Mbit/s") and "750 kB" in note and "500 ms" in note


def test_factor_rows_are_named_by_the_factor_and_make_valid_job_ids(tmp_path: Path) -> None:
    from workers.registry import load_job_settings

    rows = plan([WireFactor(4.0), 2.7], [20.0], 1, codec_sets("none,job"))
    assert [(name, rate) for _, name, rate, _, _ in rows] == [
        ("in-cluster", None), ("4x-20ms-none", WireFactor(4.0)), ("4x-20ms-job", WireFactor(4.0)),
        ("2.7mbit-20ms-none", 2.7), ("2.7mbit-20ms-job", 2.7)]
    demo = str(ROOT / "config" / "demo.toml")
    env = row_env(load_job_settings(demo), "4x-20ms-job-r1", 24, tmp_path, local=False)
    assert load_job_settings(demo, environ=env).job.id == "demo-wan-4x-20ms-job-r1"


@pytest.mark.parametrize("argv", [["--rates", "4x"], ["--rates", "4y", "--codecs", "none,job"]])
def test_a_factor_needs_an_uncompressed_in_cluster_row(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    from nebula_mq.cli import main

    code = main(["bench", "wan", str(ROOT / "config" / "demo.toml"), *argv])
    err = capsys.readouterr().err
    assert code != 0 and "--rates" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
