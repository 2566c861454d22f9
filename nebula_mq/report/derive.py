"""Figures derived from a parsed run: rates, ratios, job state. Pure numpy, no plotting.

Link utilisation over time is an *estimate*: workers count wire bytes as
process-lifetime totals (Prometheus counters), while only the history has
timestamps. Bytes per step are close to constant in a pipeline (same tensor
shapes every micro-batch, same codec chain), so bytes/s(t) = steps/s(t) x mean
wire bytes per step. The page labels it as such; the exact totals sit beside it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nebula_mq.report.records import RunData, WorkerMetrics, WorkerRun


@dataclass(frozen=True)
class RateSeries:
    # Bin centres, seconds since the run's time origin.
    t: np.ndarray
    # Events per second in each bin.
    rate: np.ndarray
    bin_s: float


@dataclass(frozen=True)
class FlowCompression:
    flow: str
    # The side whose counters were summed, "out" (senders) or "in" (receivers); never
    # both, which would count each message twice. Counters restart with a process, so
    # the side that counted more messages is the more complete one (ties: "out").
    direction: str
    messages: float
    raw_bytes: float
    wire_bytes: float

    @property
    def ratio(self) -> float | None:
        """raw / wire: how many times smaller the flow is on the wire."""
        return self.raw_bytes / self.wire_bytes if self.wire_bytes > 0 else None


@dataclass(frozen=True)
class TrafficRow:
    worker: str
    flow: str
    direction: str
    messages: float
    raw_bytes: float
    wire_bytes: float
    # Wire bits per second over the process's wall time; None if that is unknown.
    avg_bits_per_s: float | None


def time_origin(run: RunData) -> float | None:
    """Earliest known moment of the run (first history row or process start)."""
    starts = [w.history[0]["time"] for w in run.workers.values() if w.history]
    starts += [w.metrics.started for w in run.workers.values() if w.metrics and w.metrics.started]
    if not starts:
        starts = [f.time for f in run.faults]
    return min(starts) if starts else None


def step_rate(history: Sequence[Mapping[str, float]], origin: float, bins: int | None = None) -> RateSeries | None:
    """Steps per second over time, from history timestamps (None with < 2 rows)."""
    times = np.sort(np.array([row["time"] for row in history], dtype=np.float64))
    if times.size < 2 or times[-1] <= times[0]:
        return None
    n = bins or int(np.clip(times.size // 4, 4, 60))
    counts, edges = np.histogram(times, bins=n)
    width = float(edges[1] - edges[0])
    return RateSeries(t=(edges[:-1] + edges[1:]) / 2 - origin, rate=counts / width, bin_s=width)


def wire_bytes_per_step(metrics: WorkerMetrics, direction: str = "out", raw: bool = False) -> float | None:
    """Wire (or, with ``raw``, uncompressed) bytes a step of the worker's current process, over
    its flows in ``direction``; None before its first step."""
    if metrics.steps <= 0:
        return None
    counts = metrics.raw_bytes if raw else metrics.wire_bytes
    return sum(v for (_, d), v in counts.items() if d == direction) / metrics.steps


def process_wall_s(worker: WorkerRun) -> float | None:
    """Seconds the worker's current process has run, as far as the files tell."""
    if worker.metrics is None or not worker.metrics.started or worker.status is None:
        return None
    wall = worker.status.updated - worker.metrics.started
    return wall if wall > 0 else None


def flow_compression(workers: Iterable[WorkerRun]) -> list[FlowCompression]:
    sums: dict[tuple[str, str], list[float]] = {}
    for w in workers:
        if w.metrics is None:
            continue
        for (flow, d), raw in w.metrics.raw_bytes.items():
            acc = sums.setdefault((flow, d), [0.0, 0.0, 0.0])
            acc[0] += w.metrics.messages.get((flow, d), 0.0)
            acc[1] += raw
            acc[2] += w.metrics.wire_bytes.get((flow, d), 0.0)
    out = []
    for flow in sorted({f for f, _ in sums}):
        d = max(("out", "in"), key=lambda side: (sums.get((flow, side), [-1.0])[0], side == "out"))
        messages, raw, wire = sums[(flow, d)]
        out.append(FlowCompression(flow, d, messages, raw, wire))
    return out


def traffic_rows(workers: Iterable[WorkerRun]) -> list[TrafficRow]:
    rows = []
    for w in workers:
        if w.metrics is None:
            continue
        wall = process_wall_s(w)
        m = w.metrics
        for key in sorted(set(m.wire_bytes) | set(m.raw_bytes) | set(m.messages)):
            wire = m.wire_bytes.get(key, 0.0)
            rows.append(TrafficRow(w.worker_id, key[0], key[1], m.messages.get(key, 0.0),
                                   m.raw_bytes.get(key, 0.0), wire,
                                   8 * wire / wall if wall else None))
    return rows


def job_state(workers: Iterable[WorkerRun]) -> str:
    """One word for the whole job, worst first: failed > running > stopped > finished."""
    states = {w.status.state for w in workers if w.status is not None}
    if not states:
        return "unknown"
    for state, when in (("failed", {"failed"}), ("running", {"running", "starting", "resuming"}),
                        ("stopped", {"stopped"})):
        if states & when:
            return state
    return "finished" if states == {"finished"} else "unknown"


def ema(values: np.ndarray, span: int) -> np.ndarray:
    """Exponential moving average (pandas ewm(span).mean(), adjust=False); NaNs are skipped."""
    alpha = 2.0 / (span + 1.0)
    out = np.empty_like(values, dtype=np.float64)
    acc = np.nan
    for i, v in enumerate(values):
        if np.isfinite(v):
            acc = v if not np.isfinite(acc) else alpha * v + (1 - alpha) * acc
        out[i] = acc
    return out


# --------------------------------------------------------------------------- units


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def bits_rate_unit(peak_bits_per_s: float) -> tuple[float, str]:
    """Divisor and label for a bit rate axis (WAN links are specified in Mbit/s)."""
    for div, label in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if peak_bits_per_s >= div:
            return div, label
    return 1.0, "bit/s"


def human_bits_rate(bits_per_s: float) -> str:
    div, label = bits_rate_unit(bits_per_s)
    return f"{bits_per_s / div:.3g} {label}"


def human_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


# Steps averaged at each end of a loss curve for its one-line summary.
SUMMARY_STEPS = 10


def loss_summary(run_dir: Path, workers: Sequence[str]) -> str | None:
    """The job's loss in one line, from the history of the first of ``workers`` that records
    one (the one that also records a ``baseline`` first): ``tail-0: loss 0.387 -> 0.0124 over
    200 steps (a model that learnt nothing: 0.43)``, each end the mean of
    :data:`SUMMARY_STEPS` steps; None when no worker recorded a loss."""
    from nebula_mq.report.parse import read_history

    curves: list[tuple[str, list[Mapping[str, float]]]] = []
    for worker in workers:
        path = run_dir / "history" / f"{worker}.jsonl"
        try:
            read, _ = read_history(path.read_text(), str(path))
        except OSError:
            continue
        kept = [r for r in read if "loss" in r and np.isfinite(r["loss"])]
        if kept:
            curves.append((worker, kept))
    if not curves:
        return None
    worker, rows = next(((w, r) for w, r in curves if "baseline" in r[-1]), curves[0])
    first = float(np.mean([r["loss"] for r in rows[:SUMMARY_STEPS]]))
    last = float(np.mean([r["loss"] for r in rows[-SUMMARY_STEPS:]]))
    line = f"{worker}: loss {first:.4g} -> {last:.4g} over {len(rows)} steps"
    return line + (f" (a model that learnt nothing: {rows[-1]['baseline']:.4g})" if "baseline" in rows[-1] else "")
