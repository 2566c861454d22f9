"""One torch split job of the GPU check: both sides in threads of this process over the
in-memory transport (as tests/fixtures/pairs.py runs pairs), timed per step, and the
comparison of two runs' last checkpoints."""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.driver import Driver
from nebula_mq.runtime.hooks import Hook
from nebula_mq.settings import CodecSettings, JobSettings, Settings, TransportSettings
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport
from wide_mlp import Size, head_spec, tail_spec

REPO = Path(__file__).resolve().parents[2]
WORKERS = ("head-0", "tail-0")


def _threads() -> ModuleType:
    """tests/fixtures/threads.py (run_workers), loaded by its path: ``tests`` is a namespace
    package, which a stray ``tests`` package in a machine's site-packages would shadow."""
    path = REPO / "tests" / "fixtures" / "threads.py"
    spec = importlib.util.spec_from_file_location("gpu_check_threads", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_workers: Callable[..., None] = _threads().run_workers


def settings(run_dir: Path, device: str, steps: int, lr: float = 1e-3) -> Settings:
    """The example's job (fp16 activations, int8 gradients, two micro-batches in flight),
    both sides on ``device`` through ``[job] device``."""
    return Settings(
        job=JobSettings(id="gpu-check", scenario="split", seed=7, steps=steps, run_dir=str(run_dir),
                        device=device, tensorboard=False),
        codec=CodecSettings(forward="fp16", backward="int8"),
        transport=TransportSettings(publish_patience_s=60.0),
        split={"in_flight": 2, "lr": lr, "checkpoint_every": max(5, steps // 2),
               "head_cluster": "s", "tail_cluster": "t"},
    )


class Clock(Hook):
    """When each step ended, and its values (the tail's loss)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.losses: list[float] = []

    def on_step(self, step: int, values: Mapping[str, float]) -> None:
        self.times.append(time.perf_counter())
        self.losses.append(float(values.get("loss", math.nan)))

    def steps_per_s(self) -> float:
        """Steady-state rate: the first quarter of the steps (at most 5) is warm-up."""
        if len(self.times) < 3:
            return math.nan
        warm = min(5, len(self.times) // 4)
        return (len(self.times) - 1 - warm) / max(1e-9, self.times[-1] - self.times[warm])


@dataclass
class Run:
    """What one run (or one leg of a stopped-and-resumed run) did."""

    run_dir: Path
    devices: tuple[str, str]  # where the head's and the tail's parameters live
    steps: tuple[int, int]
    losses: list[float] = field(default_factory=list)
    steps_per_s: float = math.nan
    peak_mib: float = math.nan
    seconds: float = math.nan


def run_pair(size: Size, settings_: Settings, broker: MemoryBroker, stop_at: int | None = None,
             timeout: float = 300.0) -> Run:
    """Run the head and the tail to the end (or to ``stop_at``, as SIGTERM would)."""
    from workers.split.head import SpecHead
    from workers.split.tail import SpecTail

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    job = settings_.job.id
    tail = SpecTail(settings_, tail_spec(size), SpecTail.identity(settings_).worker(
        MemoryTransport(broker, settings_.transport, job, "t")))
    head = SpecHead(settings_, head_spec(size), SpecHead.identity(settings_).worker(
        MemoryTransport(broker, settings_.transport, job, "s")))
    clock = Clock()
    tail.worker.hooks.add(clock)
    run_workers([Driver(tail.worker, tail), Driver(head.worker, head)], stop_at, timeout=timeout)
    devices = (str(next(head.model.parameters()).device), str(next(tail.model.parameters()).device))
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else math.nan
    return Run(Path(settings_.job.run_dir), devices, (head.worker.step, tail.worker.step), clock.losses,
               clock.steps_per_s(), peak, time.perf_counter() - t0)


def compare(a: Path, b: Path, worker: str) -> tuple[bool, str]:
    """Whether two runs' last checkpoints of ``worker`` are bit-identical; if not, by how much
    their arrays differ."""
    ca = CheckpointStore(a / "checkpoints" / worker).latest()
    cb = CheckpointStore(b / "checkpoints" / worker).latest()
    if ca is None or cb is None:
        return False, f"no checkpoint in {a if ca is None else b}"
    if ca.step != cb.step:
        return False, f"last checkpoints at steps {ca.step} and {cb.step}"
    if ca.digest == cb.digest:
        return True, f"bit-identical at step {ca.step} (sha256 {ca.digest[:12]})"
    return False, f"step {ca.step}: " + array_diff(ca.arrays, cb.arrays)


def array_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """How far apart two checkpoints' arrays are: how many differ, the largest |a - b|."""
    keys = sorted(set(a) | set(b))
    differ, worst, where = 0, 0.0, ""
    for key in keys:
        if key not in a or key not in b:
            differ, where = differ + 1, where or f"{key} (missing)"
            continue
        x, y = np.asarray(a[key]), np.asarray(b[key])
        if x.shape != y.shape:
            differ, where = differ + 1, where or f"{key} (shape)"
            continue
        if np.array_equal(x, y):
            continue
        differ += 1
        gap = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))))
        if gap >= worst:
            worst, where = gap, key
    return f"{differ}/{len(keys)} arrays differ, max |diff| {worst:.3g} ({where})"
