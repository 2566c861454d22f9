"""``nebula-mq bench wan --quick`` on the session stack: the same split job inside one cluster and
across the shaped WAN. Not a speed gate (the host is shared): both rows must train, the WAN row
must end with the very model the in-cluster row trained, and the links' shape must be put back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from nebula_mq.cli import main
from tests.fixtures.pairs import SPLIT_EXAMPLE

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_quick_wan_bench_trains_the_same_model_in_one_cluster_and_across_the_wan(
        stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("mlp.py", "mlp_data.py", "job.toml"):
        shutil.copy(SPLIT_EXAMPLE / name, tmp_path)
    before = stack.wan_shapes()
    out = tmp_path / "wan.json"
    try:
        code = main(["bench", "wan", str(tmp_path / "job.toml"), "--quick", "--stack", str(stack.run_dir),
                     "--json-out", str(out)])
        after = stack.wan_shapes()
    finally:
        stack.clean_wan()
    assert code == 0
    assert after == before  # the links are shaped as they were
    rows = json.loads(out.read_text())["rows"]
    assert [r["row"] for r in rows] == ["in-cluster", "10mbit-20ms"]
    assert all(r["samples_per_s"] > 0 and r["samples"] == 30 * 32 for r in rows)
    assert rows[0]["final_loss"] == rows[1]["final_loss"]  # the link's speed never changes the model
    text = capsys.readouterr().out
    assert "vs in-cluster" in text and "1.00x" in text
