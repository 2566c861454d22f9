"""``bench wan --rates 4x``: a link set by the paper's regime (the uncompressed wire 4 times the
compute in one cluster) rather than in Mbit/s, so the regime follows the host's speed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from nebula_mq.bench.wan import Profile, WireFactor, codec_sets, factor_notes, link_rates, plan, resolve, row_env
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


def test_a_factor_needs_an_uncompressed_in_cluster_row(capsys: pytest.CaptureFixture[str]) -> None:
    from nebula_mq.cli import main

    code = main(["bench", "wan", str(ROOT / "config" / "demo.toml"), "--rates", "4x"])  # --codecs job, the default
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--rates" in err and "uncompressed in-cluster row" in err and "--codecs none,job" in err


def test_a_mistyped_rate_is_refused_before_any_broker_starts(capsys: pytest.CaptureFixture[str]) -> None:
    from nebula_mq.cli import main

    code = main(["bench", "wan", str(ROOT / "config" / "demo.toml"), "--rates", "4y", "--codecs", "none,job",
                 "--stack", "/nonexistent/stack"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--rates" in err and "4x" in err  # the error shows the form a factor takes


def test_a_factor_row_runs_on_the_link_its_in_cluster_row_sets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_metrics: Callable[..., None]) -> None:
    """The run's order with the workers and the stack left out: the in-cluster row's profile sets
    the factor's rate before the first WAN row shapes the link, every repeat shapes that same
    link, and the JSON keeps the profile."""
    import nebula_mq.stack
    from nebula_mq.bench import wan
    from nebula_mq.cli import main

    shaped: list[tuple[float, float]] = []

    class Links:  # the stack's WAN links, as far as the bench uses them
        @classmethod
        def open(cls, _dir: str) -> Links:
            return cls()

        def status(self) -> dict[str, object]:
            return {}

        def link_up(self, _cluster: None, rate_mbit: float, delay_ms: float) -> None:
            shaped.append((rate_mbit, delay_ms))

    def run_row(_config: str, _stack: str, env: dict[str, str], _timeout: float) -> SimpleNamespace:
        run_dir = Path(env["NEBULA__JOB__RUN_DIR"])  # 150 kB of activations a step, 100 steps
        write_metrics(run_dir, {"enc-0": {("activations", "out"): 100}, "dec-0": {("reply", "out"): 100}},
                      wire=150_000)
        return SimpleNamespace(run_dir=run_dir, plan=None)

    monkeypatch.setattr(nebula_mq.stack, "Stack", Links)
    monkeypatch.setattr(wan, "run_row", run_row)
    monkeypatch.setattr(wan, "sides", lambda _plan: (["enc-0"], ["dec-0"]))
    # 16 samples a step at 0.15 s, the decoder computing 80% of it: 0.12 s of compute a step.
    monkeypatch.setattr(wan, "measure", lambda *_a: {
        "samples_per_s": 16 / 0.15, "samples": 1600, "step_s_median": 0.1, "final_loss": 6.0,
        "busiest_bytes_per_step": 150_000.0})
    monkeypatch.setattr(wan, "shares", lambda _run_dir: {"enc-0": 0.5, "dec-0": 0.8})
    out = tmp_path / "wan.json"
    code = main(["bench", "wan", str(ROOT / "config" / "demo.toml"), "--rates", "4x", "--delay-ms", "20",
                 "--codecs", "none", "--steps", "100", "--repeats", "2", "--json", str(out)])
    assert code == 0
    assert shaped == [(2.5, 20.0), (2.5, 20.0)]  # 150 kB x 8 over 4 x 0.12 s, in both repeats
    saved = json.loads(out.read_text())
    assert saved["profile"]["compute_s"] == pytest.approx(0.12)
    assert [r["rate_mbit"] for r in saved["rows"]] == [None, 2.5, None, 2.5]
