"""What a run directory holds, as plain frozen records (read by ``report.parse``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WorkerStatus:
    worker: str
    role: str
    cluster: str
    job: str
    pid: int
    # starting | running | finished | stopped | failed (Worker.main)
    state: str
    step: int
    # Unix time of the last write: a "running" worker with an old one is stuck or dead.
    updated: float
    values: Mapping[str, float]


@dataclass(frozen=True)
class WorkerMetrics:
    """A worker's counters. They cover its *current process* only: a restart resets them."""

    steps: float
    # Keyed by (flow, direction), direction "out" (published) or "in" (received).
    raw_bytes: Mapping[tuple[str, str], float]
    wire_bytes: Mapping[tuple[str, str], float]
    messages: Mapping[tuple[str, str], float]
    redeliveries: Mapping[str, float]
    duplicates: Mapping[str, float]
    # Keyed by (flow, reason slug from errors.py).
    dead_letters: Mapping[tuple[str, str], float]
    compute_s: float
    wait_s: float
    queue_messages: Mapping[str, float]
    values: Mapping[str, float]
    # Unix start time of the process the counters belong to; None in older files.
    started: float | None


@dataclass(frozen=True)
class WorkerRun:
    worker_id: str
    status: WorkerStatus | None
    # One mapping per step (keys: step, time, and values such as loss), sorted by
    # step; a step re-run after a restart keeps its latest row.
    history: tuple[Mapping[str, float], ...]
    metrics: WorkerMetrics | None
    checkpoints: tuple[int, ...]


@dataclass(frozen=True)
class Fault:
    time: float
    kind: str
    target: str
    # None: the target had not recovered when the chaos run ended.
    recovered_after_s: float | None


@dataclass(frozen=True)
class RunData:
    run_dir: Path
    workers: Mapping[str, WorkerRun]
    # Compression study rows in file order; each has at least "chain".
    study: tuple[Mapping[str, Any], ...]
    faults: tuple[Fault, ...]
    # Benchmark JSON documents by file stem, shown as tables where they are row lists.
    bench: Mapping[str, Any]
    # Human-readable notes on files that exist but could not be read.
    problems: tuple[str, ...]
    # eval.json: the job's evaluation (scores per domain, hypotheses, references); None if absent.
    evaluation: Mapping[str, Any] | None = None
    # queues/*.jsonl: (unix time, queue, ready messages, their bytes or NaN when the broker has no
    # management API), as the workers sampled them.
    queue_depths: tuple[tuple[float, str, float, float], ...] = ()

