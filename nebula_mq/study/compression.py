"""``nebula-mq study compression``: paper Table 5 and Figure 10 on one data set, seed and link.

1. Measure compute: the uncompressed pipeline, one micro-batch at a time, over
   the unshaped link.
2. Shape the WAN relay so that what one uncompressed step sends (activations
   out, gradients back) takes ``wire_factor`` x that compute time to cross (or
   use a fixed rate, e.g. the paper's 60 Mbit/s).
3. Run every row over the real two-node stack through the shaped relay, then
   the ``auto`` row, whose chains :mod:`nebula_mq.study.auto` picks from the
   measured compute time and link rate.
4. Compare with both baselines: the paper's (uncompressed, one micro-batch at
   a time) and the uncompressed pipeline (several in flight): speed-ups,
   paired-bootstrap BLEU; write JSON rows, the targets, and plots to ``<out_dir>``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nebula_mq.study import auto, report
from nebula_mq.study.rows import SEQUENTIAL_BASELINE, StudyRow
from nebula_mq.study.runner import Link, MemoryLink, RowResult, StackLink, StudyConfig, run_row


@dataclass(frozen=True)
class Calibration:
    # s/step of the uncompressed pipeline run one micro-batch at a time with no
    # rate limit: S forward, T forward + backward, S backward, one after another.
    compute_s: float
    # Slower side's compute per step: what bounds a pipeline whose wire is free.
    compute_bound_s: float
    forward_bytes: float  # uncompressed activation message bytes per step
    backward_bytes: float  # uncompressed gradient message bytes per step
    activation_shape: tuple[int, int, int]  # typical [B, S, H]
    rate_mbit: float  # what the relay is shaped to


def calibrate(cfg: StudyConfig, work: Path, wire_factor: float, link: Link | None = None,
              steps: int = 80) -> Calibration:
    """Compute time first, then the rate at which the uncompressed wire time of a step
    (activations out plus gradients back) is ``wire_factor`` x the compute time.

    "Compute" is the s/step of the uncompressed pipeline with one micro-batch in
    flight on ``link`` left unshaped (brokers, TLS and federation included, no
    rate limit), or over the memory broker."""
    from nebula_mq.models import abnet_config

    link = link or MemoryLink()
    if isinstance(link, StackLink):
        link.shape(0.0)  # unlimited: what the pipeline does when the wire is not the bottleneck
    probe = dataclasses.replace(cfg, steps=min(cfg.steps, steps), eval_samples=0)
    r = run_row(SEQUENTIAL_BASELINE, probe, link, work / "calibration")
    hidden = abnet_config.preset(cfg.preset).encoder.hidden if cfg.preset != "small" else 384
    wire_bytes = r.forward_bytes_per_step + r.backward_bytes_per_step
    rate = wire_bytes * 8 / (wire_factor * r.s_per_step) / 1e6
    return Calibration(r.s_per_step, r.compute_bound_s_per_step, r.forward_bytes_per_step,
                       r.backward_bytes_per_step, auto.activation_shape(r.forward_bytes_per_step, cfg.batch_size, hidden),
                       rate)


class OwnStack:
    """A private two-node stack for the study, torn down afterwards."""

    def __enter__(self) -> Any:
        from nebula_mq.stack import Stack
        from nebula_mq.stack.layout import free_base_port

        self.dir = tempfile.mkdtemp(prefix="nebula-study-", dir="/tmp")
        self.stack = Stack(self.dir, ("cluster-s", "cluster-t"), base_port=free_base_port(2, os.getpid()),
                           prefix=f"nbs{os.getpid()}")
        self.stack.up()
        return self.stack

    def __exit__(self, *exc: object) -> None:
        try:
            self.stack.down()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def run_rows(rows: Sequence[StudyRow], cfg: StudyConfig, link: Link, work: Path,
             on_row: Callable[[RowResult], None] | None = None) -> list[RowResult]:
    out: list[RowResult] = []
    for row in rows:
        result = run_row(row, cfg, link, work / f"{len(out):02d}-{row.slug}")
        out.append(result)
        if on_row is not None:
            on_row(result)
    return out


def auto_row(cal: Calibration, rate_mbit: float) -> StudyRow:
    choice = auto.pick(auto.LinkProfile(rate_mbit, cal.compute_bound_s, cal.activation_shape))
    return dataclasses.replace(choice.row, origin="auto")


def study(rows: Sequence[StudyRow], cfg: StudyConfig, out_dir: Path, tag: str, link: Link,
          cal: Calibration | None, with_auto: bool = True,
          on_row: Callable[[RowResult], None] | None = None) -> list[dict[str, Any]]:
    """Run the rows (and ``auto``) over ``link``; write and return the compared rows."""
    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # one INFO line per bootstrap
    work = out_dir / "runs" / tag
    shutil.rmtree(work, ignore_errors=True)
    todo = list(rows)
    picked = auto_row(cal, link.rate_mbit) if with_auto and cal is not None else None
    if picked is not None and picked.chain not in {r.chain for r in todo}:
        todo.append(picked)
    results = run_rows(todo, cfg, link, work, on_row)
    compared = report.compare(results)
    for r in compared:  # the row `auto` would run on this link (it may also be a table row)
        r["auto_pick"] = picked is not None and r["chain"] == picked.chain
    report.write(compared, out_dir, tag, cal.compute_s if cal is not None else None)
    return compared


def stack_link(stack: Any, rate_mbit: float, delay_ms: float = 0.0) -> StackLink:
    return StackLink(stack, rate_mbit, delay_ms)
