"""Whether a soak's samples grow without bound: the least-squares slope of each series, and
a verdict against the limits of its kind.

A soak samples every few seconds (``nebula_mq.chaos.soak``). Start-up is not a trend (imports,
the first checkpoint, broker caches): the first ``WARMUP_SHARE`` of the run is left out. What
remains is fitted with a straight line; a series fails when the line rises across that window
by more than its kind allows. Faults make the series jump (a killed worker restarts small, a
restarted broker drops its queues' memory); a line through all of the samples after warm-up is
what a leak shows through such jumps.

The step rate is judged by medians instead: it fails when the median of the window's second
half is below the first half's by more than its limit. Each fault stops the job for a few
samples (a killed worker imports its framework again), and on a short soak one fault near the
end would tilt a fitted line as much as an hour of decay; it moves a median only when the job
is stopped for half the time, which is a decay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WARMUP_SHARE = 0.25


@dataclass(frozen=True)
class Limit:
    """How much a series of this kind may change across the fitted window: ``relative`` (of
    its mean) and ``absolute`` (its unit) must both be exceeded to fail, so that a tiny
    series' noise and a large series' rounding both pass. ``falling``: a drop is the failure
    (the step rate), not a rise."""

    relative: float
    absolute: float
    falling: bool = False


LIMITS = {
    "rss_mb": Limit(relative=0.25, absolute=64.0),
    "fds": Limit(relative=0.25, absolute=16.0),
    "queued": Limit(relative=1.0, absolute=200.0),
    "dead_letters": Limit(relative=0.0, absolute=0.5),
    "steps_per_s": Limit(relative=0.4, absolute=0.0, falling=True),
}


@dataclass(frozen=True)
class Trend:
    series: str  # "<owner> <kind>", e.g. "tail-0 rss_mb", "cluster-b fds"
    kind: str
    samples: int
    first: float
    last: float
    mean: float
    slope_per_h: float
    change: float  # the fitted line's change across the window (the step rate's verdict uses medians)
    ok: bool


def slope(times: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` over ``times`` (units per second); 0 for < 2 points."""
    n = len(times)
    if n < 2:
        return 0.0
    mt, mv = sum(times) / n, sum(values) / n
    var = sum((t - mt) ** 2 for t in times)
    if var == 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in zip(times, values)) / var


def trend(series: str, kind: str, times: Sequence[float], values: Sequence[float]) -> Trend:
    """The trend of one series after warm-up, judged by ``LIMITS[kind]``."""
    if not times:
        return Trend(series, kind, 0, 0.0, 0.0, 0.0, 0.0, 0.0, True)
    start = times[0] + WARMUP_SHARE * (times[-1] - times[0])
    kept = [(t, v) for t, v in zip(times, values) if t >= start]
    ts, vs = [t for t, _ in kept], [v for _, v in kept]
    per_s = slope(ts, vs)
    change = per_s * (ts[-1] - ts[0])
    mean = sum(vs) / len(vs)
    limit = LIMITS[kind]
    if limit.falling:
        half = len(vs) // 2
        grew = _median(vs[:half] or vs) - _median(vs[half:])
    else:
        grew = change
    ok = not (grew > limit.absolute and grew > limit.relative * abs(mean))
    return Trend(series, kind, len(vs), vs[0], vs[-1], mean, per_s * 3600.0, change, ok)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def format_trends(trends: Sequence[Trend]) -> str:
    rows = [f"{'series':<28} {'samples':>7} {'first':>10} {'last':>10} {'mean':>10} {'slope/h':>10}  verdict"]
    for t in trends:
        verdict = "ok" if t.ok else ("DECAYS" if LIMITS[t.kind].falling else "GROWS")
        rows.append(f"{t.series:<28} {t.samples:>7} {t.first:>10.4g} {t.last:>10.4g} {t.mean:>10.4g} "
                    f"{t.slope_per_h:>10.4g}  {verdict}")
    return "\n".join(rows)
