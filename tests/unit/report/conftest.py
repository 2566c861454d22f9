"""Run directories written by the workers' own writers, for the report's readers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nebula_mq.runtime.hooks import MessageEvent
from nebula_mq.runtime.metrics import MetricsHook

# worker -> (flow, direction) -> messages
Counts = dict[str, dict[tuple[str, str], int]]


@pytest.fixture
def write_metrics() -> Callable[..., None]:
    """Writes ``<run_dir>/metrics/<worker>.prom`` through a real MetricsHook: ``counts``
    messages of ``raw`` bytes, ``wire`` bytes each on the wire, then ``steps`` steps."""

    def write(run_dir: Path, counts: Counts, raw: int = 100, wire: int = 25, steps: int = 1) -> None:
        for worker, by_key in counts.items():
            hook = MetricsHook("r", run_dir / "metrics" / f"{worker}.prom")
            for (flow, direction), n in by_key.items():
                for _ in range(n):
                    ev = MessageEvent(flow, raw_bytes=raw, wire_bytes=wire)
                    (hook.on_published if direction == "out" else hook.on_received)(ev)
            for step in range(1, steps + 1):
                hook.on_step(step, {})
    return write
