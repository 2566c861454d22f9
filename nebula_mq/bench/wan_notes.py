"""``bench wan``'s notes under its table: why a WAN row is below its in-cluster row, where the
run's own numbers say so. A link too slow for a step's bytes is named first: a deeper window
cannot help there. Otherwise a window too small for the round trip is named."""

from __future__ import annotations

import math
from typing import Any


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
