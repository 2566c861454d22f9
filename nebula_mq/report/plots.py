"""The report's figures as PNG bytes (matplotlib, Agg canvas, no pyplot state).

Each function returns None when the run has nothing to draw, so the page can
say "no data" instead of showing an empty frame.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from nebula_mq.report.derive import (
    bits_rate_unit, ema, process_wall_s, step_rate, wire_bytes_per_step,
)
from nebula_mq.report.records import Fault, RunData

DPI = 110
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
COMPUTE, WAIT, OTHER = "#2b6cb0", "#dd6b20", "#cbd5e0"
MAX_VALUE_PANELS = 6


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _style(ax: Axes) -> None:
    ax.grid(True, color="#e2e8f0", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=8)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


def _time_unit(span_s: float) -> tuple[float, str]:
    return (60.0, "minutes since start") if span_s > 600 else (1.0, "seconds since start")


def _mark_faults(ax: Axes, faults: Iterable[Fault], origin: float, div: float) -> None:
    """A dashed line at each fault and a shaded band until it recovered."""
    labelled = False
    for f in faults:
        t = (f.time - origin) / div
        ax.axvline(t, color="#c53030", linestyle="--", linewidth=1, label=None if labelled else "fault")
        if f.recovered_after_s:
            ax.axvspan(t, t + f.recovered_after_s / div, color="#feb2b2", alpha=0.35, linewidth=0,
                       label=None if labelled else "until recovered")
        labelled = True


def _mark_restarts(ax: Axes, run: RunData, origin: float, div: float) -> None:
    """A dotted line where a worker's current process started after its first step:
    a restart (resume from checkpoint), which also explains a gap in the curves."""
    labelled = False
    for w in run.workers.values():
        started = w.metrics.started if w.metrics else None
        if started and w.history and started > w.history[0]["time"]:
            ax.axvline((started - origin) / div, color="#4a5568", linestyle=":", linewidth=1.2,
                       label=None if labelled else "process restart")
            labelled = True


def _width(i: int) -> float:
    """Wider lines first: workers of a lockstep pipeline trace the same curve and
    would otherwise hide each other."""
    return max(0.9, 2.6 - 0.6 * i)


def value_names(run: RunData) -> list[str]:
    """History value names, losses first, at most MAX_VALUE_PANELS."""
    names = {k for w in run.workers.values() for row in w.history for k in row} - {"step", "time"}
    return sorted(names, key=lambda n: ("loss" not in n.lower(), n))[:MAX_VALUE_PANELS]


def training_curves(run: RunData) -> bytes | None:
    names = value_names(run)
    if not names:
        return None
    cols = min(3, len(names))
    rows = (len(names) + cols - 1) // cols
    fig = _figure(3.6 * cols + 0.6, 2.9 * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, name in zip(axes, names):
        for i, w in enumerate(run.workers.values()):
            pts = [(r["step"], r[name]) for r in w.history if name in r]
            if not pts:
                continue
            steps, vals = (np.array(v, dtype=np.float64) for v in zip(*pts))
            color = COLORS[i % len(COLORS)]
            if len(vals) > 30:  # raw trace faint, a smoothed trend on top
                ax.plot(steps, vals, color=color, alpha=0.25, linewidth=0.8)
                ax.plot(steps, ema(vals, max(5, len(vals) // 20)), color=color, linewidth=1.6,
                        label=w.worker_id)
            else:
                ax.plot(steps, vals, color=color, linewidth=1.4, marker="o", markersize=2.5,
                        label=w.worker_id)
        ax.set_title(name, fontsize=10, loc="left")
        ax.set_xlabel("step", fontsize=8)
        _style(ax)
        ax.legend(fontsize=7, frameon=False)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    return _png(fig)


def _time_plot(fig: Figure, ax: Axes, ylabel: str, xlabel: str) -> bytes:
    """A per-series plot over time, from 0 up, its legend outside on the right."""
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylim(bottom=0)
    _style(ax)
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def throughput(run: RunData, origin: float) -> bytes | None:
    series = {w.worker_id: s for w in run.workers.values()
              if (s := step_rate(w.history, origin)) is not None}
    if not series:
        return None
    span = max(float(s.t[-1] + s.bin_s / 2) for s in series.values())
    div, xlabel = _time_unit(span)
    fig = _figure(9.5, 3.0)
    ax = fig.subplots()
    for i, (wid, s) in enumerate(series.items()):
        ax.plot(s.t / div, s.rate, drawstyle="steps-mid", color=COLORS[i % len(COLORS)], linewidth=_width(i),
                label=wid)
    _mark_faults(ax, run.faults, origin, div)
    _mark_restarts(ax, run, origin, div)
    return _time_plot(fig, ax, "steps / s", xlabel)


def queue_depths(run: RunData, origin: float) -> bytes | None:
    """Ready messages per queue over time (where backpressure holds the work) and, when the
    brokers' management API gave them, their bytes (what the queue caps bound) below."""
    by_queue: dict[str, list[tuple[float, float, float]]] = {}
    for t, queue, messages, size in run.queue_depths:
        by_queue.setdefault(queue, []).append((t - origin, messages, size))
    if not by_queue:
        return None
    span = max(t for pts in by_queue.values() for t, _, _ in pts) or 1.0
    div, xlabel = _time_unit(span)
    sized = any(np.isfinite(size) for pts in by_queue.values() for _, _, size in pts)
    fig = _figure(9.5, 5.0 if sized else 3.0)
    axes = fig.subplots(2, 1, sharex=True) if sized else [fig.subplots()]
    peak = max((size for pts in by_queue.values() for _, _, size in pts if np.isfinite(size)), default=0.0)
    ydiv, yunit = next(((d, u) for d, u in ((2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB")) if peak >= d),
                       (1.0, "B"))
    for i, (queue, pts) in enumerate(sorted(by_queue.items())):
        times, depth, sizes = (np.array(v, dtype=np.float64) for v in zip(*pts))
        style: dict[str, Any] = {"drawstyle": "steps-post", "color": COLORS[i % len(COLORS)], "linewidth": _width(i),
                 "label": queue.rsplit(".", 1)[-1]}
        axes[0].plot(times / div, depth, **style)
        if sized:
            axes[1].plot(times / div, sizes / ydiv, **style)
    for ax in axes:
        _mark_faults(ax, run.faults, origin, div)
    if sized:
        axes[0].set_ylabel("ready messages", fontsize=8)
        axes[0].set_ylim(bottom=0)
        _style(axes[0])
        return _time_plot(fig, axes[1], f"ready {yunit}", xlabel)
    return _time_plot(fig, axes[0], "ready messages", xlabel)


def link_utilisation(run: RunData, origin: float) -> bytes | None:
    """Estimated wire bits/s each worker sent: steps/s(t) x mean wire bytes per step."""
    curves: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for w in run.workers.values():
        s = step_rate(w.history, origin)
        per_step = wire_bytes_per_step(w.metrics) if w.metrics else None
        if s is None or not per_step:
            continue
        curves[w.worker_id] = (s.t, s.rate * per_step * 8)
    if not curves:
        return None
    span = max(float(t[-1]) for t, _ in curves.values())
    div, xlabel = _time_unit(span)
    ydiv, ylabel = bits_rate_unit(max(float(r.max()) for _, r in curves.values()))
    fig = _figure(9.5, 3.0)
    ax = fig.subplots()
    colors = {w: COLORS[i % len(COLORS)] for i, w in enumerate(run.workers)}
    for i, (wid, (t, bits)) in enumerate(curves.items()):
        ax.plot(t / div, bits / ydiv, drawstyle="steps-mid", color=colors[wid], linewidth=_width(i),
                label=f"{wid} sent")
    _mark_faults(ax, run.faults, origin, div)
    _mark_restarts(ax, run, origin, div)
    return _time_plot(fig, ax, f"wire {ylabel} (estimated)", xlabel)


def compute_wait(run: RunData) -> bytes | None:
    rows = [(w.worker_id, w.metrics.compute_s, w.metrics.wait_s, process_wall_s(w))
            for w in run.workers.values() if w.metrics is not None]
    rows = [r for r in rows if r[1] + r[2] > 0]
    if not rows:
        return None
    fig = _figure(9.5, 0.55 * len(rows) + 1.1)
    ax = fig.subplots()
    y = np.arange(len(rows))[::-1]
    compute = np.array([r[1] for r in rows])
    wait = np.array([r[2] for r in rows])
    other = np.array([max(0.0, (r[3] or 0.0) - r[1] - r[2]) for r in rows])
    ax.barh(y, compute, color=COMPUTE, label="compute", height=0.6)
    ax.barh(y, wait, left=compute, color=WAIT, label="waiting on queues", height=0.6)
    if other.any():
        ax.barh(y, other, left=compute + wait, color=OTHER, label="other (codec, checkpoint, I/O)",
                height=0.6)
    ax.set_yticks(y, [r[0] for r in rows], fontsize=8)
    ax.set_xlabel("seconds (current process)", fontsize=8)
    _style(ax)
    ax.legend(fontsize=7, frameon=False, ncols=3, loc="lower left", bbox_to_anchor=(0.0, 1.0))
    return _png(fig)


def study_tradeoff(rows: Sequence[dict[str, object]] | Sequence[object]) -> bytes | None:
    """BLEU against forward compression ratio, one labelled point per codec chain."""
    pts = []
    for r in rows:
        try:
            pts.append((float(r["forward_ratio"]), float(r["bleu"]), str(r["chain"])))  # type: ignore[index]
        except (KeyError, TypeError, ValueError):
            continue
    if len(pts) < 2:
        return None
    fig = _figure(6.0, 3.4)
    ax = fig.subplots()
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=COLORS[0], zorder=3)
    for x, yv, label in pts:
        ax.annotate(label, (x, yv), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}\u00d7"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(sorted({p[0] for p in pts}))
    ax.margins(x=0.15, y=0.2)
    ax.set_xlabel("forward compression ratio (raw / wire, log scale)", fontsize=8)
    ax.set_ylabel("BLEU", fontsize=8)
    _style(ax)
    return _png(fig)
