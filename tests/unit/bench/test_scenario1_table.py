"""``bench scenario1 --repeats``: per n, the medians of its inside/across pairs and each pair's
own ratio (a pair's two runs side by side, so the host's drift between pairs cancels)."""

from __future__ import annotations

import pytest

from nebula_mq.bench.scenario1 import by_n, root_busy, where_time_goes
from nebula_mq.cli import main


def test_each_ratio_is_its_own_pairs_and_the_medians_are_per_n() -> None:
    results = [{"n": 1, "repeat": 0, "inside": 280.0, "across": 234.0, "ratio": 234 / 280, "busy_ratio": 0.97},
               {"n": 2, "repeat": 0, "inside": 177.0, "across": 223.0, "ratio": 223 / 177, "busy_ratio": 1.0},
               {"n": 1, "repeat": 1, "inside": 200.0, "across": 196.0, "ratio": 0.98, "busy_ratio": 0.99},
               {"n": 2, "repeat": 1, "inside": 210.0, "across": 200.0, "ratio": 200 / 210, "busy_ratio": 0.98},
               {"n": 1, "repeat": 2, "inside": 250.0, "across": 240.0, "ratio": 0.96, "busy_ratio": 0.95}]
    table = by_n(results)
    assert [r["n"] for r in table] == [1, 2]
    one = table[0]
    assert one["ratios"] == pytest.approx([234 / 280, 0.98, 0.96])
    assert one["ratio"] == pytest.approx(0.96)  # the median pair, not median(across) / median(inside)
    assert (one["inside"], one["across"]) == (250.0, 234.0)
    assert table[1]["ratio"] == pytest.approx((223 / 177 + 200 / 210) / 2)
    assert (one["busy_ratio"], table[1]["busy_ratio"]) == pytest.approx((0.97, 0.99))


def test_the_roots_busy_share_is_its_compute_over_compute_and_wait() -> None:
    assert root_busy({"ms_per_step": {"disc-root": {"compute": 30.0, "wait": 10.0},
                                      "gen": {"compute": 5.0, "wait": 35.0}}}) == pytest.approx(0.75)
    assert root_busy({"ms_per_step": {}}) == 0.0  # no metrics written: nothing to divide


def test_repeats_below_one_is_refused_in_one_line_before_any_broker_starts(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "scenario1", "--repeats", "0"])
    err = capsys.readouterr().err
    assert code != 0 and "--repeats" in err and "Traceback" not in err


def test_a_root_waiting_on_the_link_is_told_to_raise_the_lead() -> None:
    def row(across_wait: float) -> dict[str, object]:
        def detail(wait: float) -> dict[str, object]:
            return {"ms_per_step": {"disc-root": {"compute": 20.0, "wait": wait}, "gen": {"compute": 9.0, "wait": 9.0}}}
        return {"inside_detail": detail(1.0), "across_detail": detail(across_wait)}

    assert "max_lead" not in where_time_goes(row(2.0))  # 95.2% against 90.9%: within the hint's margin
    lines = where_time_goes(row(6.0)).splitlines()  # 76.9% busy across against 95.2% inside
    assert "0.808x" in lines[1] and "raise [electra] max_lead" in lines[2]
