"""The study over real brokers: two TLS nodes, federation through the shaped WAN relay."""

from __future__ import annotations

from pathlib import Path

import pytest

from nebula_mq.study.rows import BASELINE, StudyRow

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow]


def test_shaped_link_bounds_the_baseline_and_compression_lifts_it(stack: object, tmp_path: Path) -> None:
    from nebula_mq.study.runner import StackLink, StudyConfig, run_row

    cfg = StudyConfig(steps=14, train_samples=64, eval_samples=0, checkpoint_every=7)
    rate = 0.5  # Mbit/s: one uncompressed tiny activation (~33 kB) takes ~0.53 s
    try:
        link = StackLink(stack.stack, rate)  # type: ignore[attr-defined]
        base = run_row(BASELINE, cfg, link, tmp_path / "base")
        small = run_row(StudyRow("fp16(svd(0.5))", "int8"), cfg, link, tmp_path / "svd")
    finally:
        stack.clean_wan()  # type: ignore[attr-defined]
    assert base.wire_s_per_step > 0.4
    # The relay really is the bottleneck of the baseline ...
    assert base.s_per_step >= 0.85 * base.wire_s_per_step
    # ... and cutting bytes by ~3.5x cuts the step time accordingly (transfer overlaps compute).
    assert small.forward_ratio < 0.35 and small.backward_ratio < 0.3
    assert small.s_per_step < base.s_per_step / 2
    assert len(base.losses) == len(small.losses) == 14
