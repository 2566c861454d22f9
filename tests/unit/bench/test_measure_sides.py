"""``bench wan`` measures the busier direction's bytes a step by the plan's roles: every rank of
a side (``head-0``, ``head-0-r1``) publishes the same way across the WAN."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from nebula_mq.bench.runs import measure, sides


def plan(*processes: tuple[str, str]) -> SimpleNamespace:
    return SimpleNamespace(processes=[SimpleNamespace(worker_id=w, role=r) for w, r in processes])


def test_sides_follow_the_roles_not_the_names() -> None:
    ranks = plan(("head-0", "split-head"), ("head-0-r1", "split-head"), ("tail-0", "split-tail"))
    assert sides(ranks) == (["head-0", "head-0-r1"], ["tail-0"])
    abnet = plan(("dec-0", "abnet-decoder"), ("enc-0", "abnet-encoder"))
    assert sides(abnet) == (["enc-0"], ["dec-0"])


def test_the_busier_direction_sums_every_rank_of_its_side(tmp_path: Path,
                                                          write_metrics: Callable[..., None]) -> None:
    steps = 10
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / "head-0.jsonl").write_text(
        "".join(json.dumps({"time": 0.1 * s, "samples": 32, "loss": 1.0}) + "\n" for s in range(steps)))
    # Two head ranks publish 10 activations each, the tail 15 gradients, 1,000 wire bytes apiece.
    write_metrics(tmp_path, {"head-0": {("act", "out"): 10}, "head-0-r1": {("act", "out"): 10},
                             "tail-0": {("grad", "out"): 15}}, raw=4000, wire=1000)
    by_side = sides(plan(("head-0", "split-head"), ("head-0-r1", "split-head"), ("tail-0", "split-tail")))
    m = measure(tmp_path, "head-0", 2, by_side)
    assert m["busiest_bytes_per_step"] == 20 * 1000 / steps  # the heads' 20,000, not one rank's 10,000
    assert m["bytes_per_sample"] == 35 * 1000 / (32 * steps)
    assert measure(tmp_path, "head-0", 2)["busiest_bytes_per_step"] == 0.0  # no roles given: not measured
