"""The low-rank rows of ``bench codecs --peers`` (nebula_mq.bench.codec_peers): a fair race."""

from __future__ import annotations

import numpy as np
import pytest

from nebula_mq.bench.codec_peers import LOWRANK_FRACTION, _lowrank


def test_powersgd_and_the_peer_start_from_one_sketch_and_run_the_same_math() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    base = rng.standard_normal((2, 12, 4)) @ rng.standard_normal((2, 4, 20))
    stream = [(base + 0.1 * rng.standard_normal(base.shape)).astype(np.float32) for _ in range(4)]
    rows = _lowrank(stream, 2, torch)
    assert [r["codec"] for r in rows] == [f"powersgd({LOWRANK_FRACTION})", f"rsvd({LOWRANK_FRACTION})"]
    ours = rows[0]
    assert ours["warm_steps"] == 2 * (len(stream) - 1)  # the cold first batch is not timed
    assert ours["ratio"] > 0 and ours["ours_MBps"] > 0 and ours["peer_MBps"] > 0
    assert ours["err_ratio"] == pytest.approx(1.0, abs=1e-4)  # same start, same steps: same error
    assert rows[1]["target"] is None  # rsvd is shown for comparison only
