"""``nebula-mq bench replicas --quick`` on the session stack: a two-cluster replicas job of the
split example's MLP as DiLoCo and Streaming DiLoCo across the shaped WAN (the synchronous
row's exchange is tested in tests/unit/workers/test_replicas_sync_dp.py). Not a speed gate
(the host is shared): both rows must train the same inner steps and send the same bytes per
inner step (every parameter once per ``inner_steps``, one fragment at a time or all at
once), each row reports a utilisation for each cluster, and the links' shape is put back."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from nebula_mq.cli import main
from tests.fixtures.jobs import copy_split_example
from tests.fixtures.pairs import SPLIT_EXAMPLE
from tests.fixtures.replicas import job_text

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_quick_replicas_bench_runs_diloco_and_streaming_on_the_same_samples(
        stack: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy_split_example(tmp_path)
    shutil.copy(SPLIT_EXAMPLE / "mlp_replicas.py", tmp_path)
    (tmp_path / "job.toml").write_text(job_text("bench-replicas", tmp_path / "run", 8, codec="int8", checkpoint_every=2))

    before = stack.wan_shapes()
    out = tmp_path / "replicas.json"
    try:
        code = main(["bench", "replicas", str(tmp_path / "job.toml"), "--quick", "--modes", "diloco,streaming", "--stack", str(stack.run_dir),
                     "--json-out", str(out)])
        after = stack.wan_shapes()
    finally:
        stack.clean_wan()
    assert code == 0
    assert after == before
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["row"], r["fragments"], r["overlap_steps"]) for r in rows] == [
        ("diloco-60mbit-20ms", 1, 0), ("streaming-60mbit-20ms", 2, 2)]
    rounds = result["rounds"]
    assert [r["events"] for r in rows] == [rounds, 2 * rounds]  # the same 4 x rounds inner steps
    diloco, streaming = (r["sent_per_inner_step"] for r in rows)
    assert diloco == pytest.approx(streaming, rel=1e-9)
    for r in rows:
        assert sorted(r["utilisation"]) == ["replica-0", "replica-1"]
        assert all(0 < u <= 1.05 for u in r["utilisation"].values()), r
        assert math.isfinite(r["final_loss"]) and r["round_s"] > 0
    assert "utilisation by cluster" in capsys.readouterr().out
