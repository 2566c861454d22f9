"""``bench wan``'s table: each row's medians over the repeats beside the in-cluster row of its own
repeat, the bound worker's busy share across over inside, and the notes under it.

Samples/s follow the shared host's speed, which drifts by a fifth from one minute to the next
on a 2-core machine whatever the link; the busy share (compute over compute + wait) of the
worker that bounds the pipeline moves far less with it: where the link is hidden that worker
computes as large a share of its time across as inside, at whatever speed the host runs (on this
host single repeats still spread by about 0.05 either way).

The notes under the table say why a WAN row is below its in-cluster row, where the run's own
numbers say so. A link too slow for a step's bytes is named first: a deeper window cannot help
there. Otherwise a window too small for the round trip is named.
"""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path
from typing import Any

from nebula_mq.bench.runs import compute_wait


def shares(run_dir: Path) -> dict[str, float]:
    """Each worker's share of its time spent computing (compute over compute + wait)."""
    return {worker: busy / (busy + wait) if busy + wait else 0.0
            for worker, (busy, wait) in compute_wait(run_dir).items()}


def bound_of(compute_share: dict[str, float]) -> str | None:
    """The busiest worker of an in-cluster row: the pipeline's bound; None without metrics."""
    return max(compute_share, key=compute_share.__getitem__, default=None)


def busy_ratio(row: dict[str, Any], inside: dict[str, Any]) -> float:
    """The in-cluster row's bound (``bound_of``): its busy share in ``row`` over its share in
    ``inside``; NaN where the in-cluster row left no metrics."""
    bound = bound_of(inside["compute_share"])
    if bound is None:
        return float("nan")
    return row["compute_share"].get(bound, 0.0) / max(1e-9, inside["compute_share"][bound])


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per row name, in plan order: medians over the repeats, and each repeat's ratio
    (samples/s, and the bound's busy share: ``busy_ratio``) to the in-cluster row of that same repeat."""
    inside = {r["repeat"]: r for r in rows if r["rate_mbit"] is None}
    base = {repeat: r["samples_per_s"] for repeat, r in inside.items()}
    names = list(dict.fromkeys(r["row"] for r in rows))
    out = []
    for name in names:
        runs = [r for r in rows if r["row"] == name]
        shares_by_worker: dict[str, list[float]] = {}
        for r in runs:
            for worker, share in r["compute_share"].items():
                shares_by_worker.setdefault(worker, []).append(share)
        ratios = [r["samples_per_s"] / base[r["repeat"]] for r in runs]
        busy = [busy_ratio(r, inside[r["repeat"]]) for r in runs]
        by_side = [r.get("bytes_per_step_by_side", ()) for r in runs]
        out.append({"row": name, "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
                    "ratio": statistics.median(ratios), "ratios": ratios,
                    "step_s_median": statistics.median(r["step_s_median"] for r in runs),
                    "compute_share": {w: statistics.median(v) for w, v in shares_by_worker.items()},
                    "final_losses": sorted({r["final_loss"] for r in runs}),
                    "delay_ms": runs[0]["delay_ms"], "rate_mbit": runs[0]["rate_mbit"],
                    "busy_ratio": statistics.median(busy), "busy_ratios": busy,
                    "busiest_bytes_per_step": statistics.median(r.get("busiest_bytes_per_step", 0.0) for r in runs),
                    "bytes_per_step_by_side": [statistics.median(side) for side in zip(*by_side)],
                    "head": runs[0].get("head"),
                    "codecs": runs[0].get("codecs", "")})
    return out


def report(settings: Any, rows: list[dict[str, Any]], steps: int, warmup: int,
           notes_under: list[str] | None = None) -> str:
    """The table: every row beside the in-cluster row of the same run (of the same repeat), and
    ``notes_under`` below it (None: every row ran the job's own chains, which the header names)."""
    table = summary(rows)
    repeats = max(r["repeat"] for r in rows) + 1
    batch = rows[0]["samples"] / steps
    lines = [f"\n{settings.job.id}: {steps} steps per row, warm-up {warmup}, global batch {batch:.0f}, "
             + (f"codecs {settings.codec.forward} / {settings.codec.backward}" if notes_under is None
                else "each row's codecs in its last column")
             + (f", {repeats} repeats (medians; each repeat's ratios after the median)" if repeats > 1 else ""),
             f"{'row':<20} {'samples/s':>10} {'vs in-cluster':>14} {'busy':>6} {'step s (median)':>16} "
             f"{'compute share by worker':<34} {'final loss':>10}"]
    for r in table:
        compute = ", ".join(f"{w} {s:.0%}" for w, s in r["compute_share"].items())
        each = (f" ({', '.join(f'{x:.2f}' for x in r['ratios'])}; busy "
                f"{', '.join(f'{x:.2f}' for x in r['busy_ratios'])})" if repeats > 1 else "")
        loss = "/".join(f"{x:.4f}" for x in r["final_losses"])
        lines.append(f"{r['row']:<20} {r['samples_per_s']:>10.1f} {r['ratio']:>13.2f}x {r['busy_ratio']:>5.2f}x "
                     f"{r['step_s_median']:>16.3f} {compute:<34} {loss:>10}{each}"
                     + (f"  {r['codecs']}" if notes_under is not None else ""))
    bound = bound_of(table[0]["compute_share"]) or "-"
    lines.append(f"({os.cpu_count()} CPU cores; the two sides and both brokers share them; WAN rows: the stack's "
                 f"relay shapes each direction; busy: {bound}'s share of its time computing over its share in "
                 "one cluster, the same repeat's: it bounds the pipeline there, and its share moves far less "
                 "than samples/s with the shared host's speed)")
    in_flight = settings.scenario_section().get("in_flight")
    step_s = table[0]["step_s_median"]
    head = table[0]["head"]
    head_turn_s = table[0]["compute_share"].get(head, 0.0) * step_s if head else 0.0  # the head's compute a step
    # The link's bound is on the ratio, so it takes the step the in-cluster rate implies (the
    # median step leaves out the slow ones and would bound below what the row measures).
    rate_step_s = batch / table[0]["samples_per_s"] if table[0]["samples_per_s"] else 0.0
    notes = [n for r in table[1:] if (n := link_note(rate_step_s, r) or window_note(in_flight, step_s, r, head_turn_s))]
    notes += notes_under or []
    return "\n".join(lines + notes)


def link_note(step_s: float, row: dict[str, Any]) -> str | None:
    """A line for a WAN row whose link cannot carry a step's bytes in one in-cluster step.

    Each direction of the link is shaped to ``rate_mbit``; a step sends its activations one way
    and its gradients the other, so the busier direction's bytes a step, over the rate, is the
    shortest a step can take across the link. Where that is longer than the in-cluster step
    (``step_s``: the batch over the in-cluster row's samples/s) the link, not the window, bounds the rate (on an H200, the language-identification split job's
    fp16 activations took 26 ms a step at 60 Mbit/s against a 14 ms step: 0.55x at any window;
    int8 took 13 ms, and 48 in flight reached 1.00-1.08x)."""
    rate, per_step = row.get("rate_mbit"), row.get("busiest_bytes_per_step")
    if not rate or not per_step or not step_s:
        return None
    wire_s = per_step * 8 / (rate * 1e6)
    if wire_s < step_s:
        return None
    return (f"note: {row['row']}: the link is full: {per_step / 1e3:.0f} kB a step in the busier direction take "
            f"{wire_s * 1000:.0f} ms at {rate:g} Mbit/s, longer than the {step_s * 1000:.0f} ms step in one cluster "
            f"(at most {step_s / wire_s:.2f}x); fewer bytes a step would help (a smaller codec), "
            "a deeper window would not")


def window_note(in_flight: int | None, step_s: float, row: dict[str, Any], head_turn_s: float = 0.0) -> str | None:
    """A line for a WAN row whose loop ``in_flight`` steps do not cover.

    The tail takes activation ``j`` and must hold ``j + in_flight`` by the time it has done
    ``in_flight`` steps. Meanwhile, after its step ``j``, the gradient crosses (a delay and its
    bytes' wire time), the head takes its turn (``head_turn_s``: apply, then the next forward)
    and the activation crosses back: ``(in_flight - 1)`` steps must span that loop, or the
    pipeline waits on the link (on an H200, in_flight 4 at 100 ms each way kept 0.54x the GPU
    busy time, 12 kept 1.05x). Each side's bytes a step come from the row
    (``bytes_per_step_by_side``). ``in_flight`` changes how stale the head's weights are when a
    gradient lands, so it is the job's to choose, not the bench's."""
    if not in_flight or not step_s or not row.get("delay_ms"):
        return None
    rate = row.get("rate_mbit")
    wire_s = sum(b * 8 / (rate * 1e6) for b in row.get("bytes_per_step_by_side", ())) if rate else 0.0
    loop_s = 2 * row["delay_ms"] / 1000 + wire_s + head_turn_s
    if (in_flight - 1) * step_s >= loop_s:
        # The loop leaves out each message's time in both brokers, the steps' spread and a
        # batch far longer than the rest (the 60-minute job's 2 MB activations at 10 Mbit/s):
        # the rate or the bound's busy share still says whether the link shows.
        ratio, busy = row.get("ratio", 1.0), row.get("busy_ratio", 1.0)
        if min(ratio, busy) >= 0.95:
            return None
        return (f"note: {row['row']}: {ratio:.2f}x the samples/s, the bound {busy:.2f}x as busy, with in_flight "
                f"{in_flight}; where the link is not full, a deeper window hides more of it (in_flight {2 * in_flight})")
    parts = f"{2 * row['delay_ms']:g} ms of delay, {wire_s * 1000:.0f} ms of wire, the head's {head_turn_s * 1000:.0f} ms turn"
    return (f"note: {row['row']}: in_flight {in_flight} leaves {(in_flight - 1) * step_s * 1000:.0f} ms "
            f"({in_flight - 1} steps of {step_s * 1000:.0f} ms) for a {loop_s * 1000:.0f} ms loop ({parts}): "
            f"the pipeline waits on the link; in_flight >= {1 + math.ceil(loop_s / step_s)} would hide it")
