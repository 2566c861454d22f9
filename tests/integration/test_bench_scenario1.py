"""``nebula-mq bench scenario1 --quick`` on its own two TLS brokers: the ELECTRA job inside one
cluster and across the shaped WAN, then the hot start (inside, then resumed across). Not a speed
gate (the host is shared): every run must train, and the hot start must resume, not restart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from nebula_mq.cli import main

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow]


@pytest.mark.timeout(420)
def test_quick_scenario1_bench_trains_inside_and_across_and_the_hot_start_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # the hot start's plot goes under run/bench
    out = tmp_path / "s1.json"
    code = main(["bench", "scenario1", "--quick", "--n", "1", "--rate-mbit", "60", "--json-out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    (row,) = report["results"]
    assert row["n"] == 1 and row["inside"] > 0 and row["across"] > 0
    assert row["inside_detail"]["steps"] == row["across_detail"]["steps"] == 24
    for where in ("inside", "across"):  # each side's compute and wait, per worker
        times = row[f"{where}_detail"]["ms_per_step"]
        assert set(times) == {"gen", "disc-root"}
        assert all(t["compute"] > 0 and t["wait"] >= 0 for t in times.values())
    assert report["by_n"][0]["ratio"] == pytest.approx(row["across"] / row["inside"])
    hot = report["hot_start"]
    # The across run goes to step 48 from the inside run's checkpoint at 24: it trains 24 steps,
    # where a run that started over would have trained 48.
    assert hot["inside_steps"] == 24 and hot["across_steps"] == 24
    assert math.isfinite(hot["before"]) and math.isfinite(hot["after"])
    assert Path(hot["plot"]).is_file()
    text = capsys.readouterr().out
    assert "across/inside ratio at the fastest n=1" in text
    assert "ms a step (compute/wait): inside " in text
