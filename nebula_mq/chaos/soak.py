"""``nebula-mq chaos JOB --soak MINUTES``: a job for a set time under random faults, sampled.

The job runs as instance ``<id>-soak`` with as many steps as the time allows. Every
``fault_every_s`` (jittered, from a seeded random schedule that has every kind once per round)
one fault is injected: a WAN cut, a SIGKILL of a worker (restarted with its group), a broker
restart, or a broker memory alarm held for a few seconds. Every ``sample_every_s`` the soak samples each worker's and each broker's
RSS and open file descriptors (from ``/proc``), the job's queued messages and dead letters
(``rabbitmqctl``), and the step rate. At the end the workers are stopped and each series'
trend is judged (:func:`trend`): the soak fails when something grows without
bound, the step rate decays, a worker exits that no fault killed, or a message is
dead-lettered.

A trend is the least-squares slope of a series, judged against the limits of its kind.
Start-up is not a trend (imports, the first checkpoint, broker caches): the first
``WARMUP_SHARE`` of the run is left out. What remains is fitted with a straight line; a series
fails when the line rises across that window by more than its kind allows. Faults make the
series jump (a killed worker restarts small, a restarted broker drops its queues' memory); a
line through all of the samples after warm-up is what a leak shows through such jumps.

The step rate is judged by medians instead: it fails when the median of the window's second
half is below the first half's by more than its limit. Each fault stops the job for a few
samples (a killed worker imports its framework again), and on a short soak one fault near the
end would tilt a fitted line as much as an hour of decay; it moves a median only when the job
is stopped for half the time, which is a decay.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nebula_mq import topology
from nebula_mq.atomic import write_json_atomic
from nebula_mq.chaos.runner import job_instance
from nebula_mq.errors import StackError
from nebula_mq.stack.node import vm_pid

FAULT_KINDS = ("cut", "kill", "restart", "alarm")
# A memory watermark no broker is under (an alarm at once), and the one every stack node runs.
ALARM_WATERMARK, NORMAL_WATERMARK = "0.000001", "0.4"
ENOUGH_STEPS = 10**7  # the job runs until the soak's time is up, not to its own end
# A process (re)started this recently is still importing or loading: its RSS and descriptors
# are no sample of a steady state, and a restart would otherwise read as a trend. No fault
# starts in a soak's last SETTLE_S either: the job ends settled, not importing at the stop.
SETTLE_S = 20.0


@dataclass(frozen=True)
class SoakOptions:
    minutes: float
    seed: int = 0
    sample_every_s: float = 10.0
    fault_every_s: float = 30.0
    kinds: tuple[str, ...] = FAULT_KINDS


@dataclass
class SoakReport:
    minutes: float
    faults: list[str] = field(default_factory=list)  # "<t> s: <what>"
    unplanned_exits: list[str] = field(default_factory=list)  # "<worker> exit <code>"
    steps: int = 0
    trends: list[Trend] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unplanned_exits and self.steps > 0 and all(t.ok for t in self.trends)


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


def proc_sample(pid: int) -> tuple[float, int] | None:
    """(RSS in MB, open file descriptors) of process ``pid``; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss_kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return rss_kb / 1024.0, fds


class Series:
    """Samples by series name: (seconds since the start, value)."""

    def __init__(self) -> None:
        self.points: dict[tuple[str, str], tuple[list[float], list[float]]] = {}

    def add(self, owner: str, kind: str, t: float, value: float) -> None:
        times, values = self.points.setdefault((owner, kind), ([], []))
        times.append(t)
        values.append(value)

    def trends(self) -> list[Trend]:
        return [trend(f"{owner} {kind}", kind, ts, vs) for (owner, kind), (ts, vs) in sorted(self.points.items())]


class Soak:
    def __init__(self, config: str, stack_dir: str, options: SoakOptions, log: Callable[[str], None] = print) -> None:
        self.job = job_instance(config, stack_dir, "soak", steps=ENOUGH_STEPS)
        self.job_id = self.job.settings.job.id
        self.options, self.log = options, log
        self.random = random.Random(options.seed)
        self.series = Series()
        self.report = SoakReport(options.minutes)
        self.bag: list[str] = []
        self.settling: dict[str, float] = {}  # worker or cluster -> when it has settled

    def run(self) -> SoakReport:
        job, opts = self.job, self.options
        job.provision()
        job.start_all()
        self.log(f"soak: job {self.job_id} for {opts.minutes:g} min, a fault about every "
                 f"{opts.fault_every_s:g} s ({', '.join(opts.kinds)}), samples every {opts.sample_every_s:g} s")
        t0 = time.monotonic()
        end = t0 + opts.minutes * 60.0
        self.settling = {w: t0 + SETTLE_S for w in job.children}
        next_fault = t0 + self._gap()
        next_sample, last = t0, (t0, 0)
        try:
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_sample:
                    last = self._sample(now - t0, last)
                    next_sample = now + opts.sample_every_s
                if now >= next_fault and (now < end - SETTLE_S or self.first_round_open()):
                    self._fault(now - t0)
                    next_fault = time.monotonic() + self._gap()
                    # A soak tries every kind of fault at least once: where slow faults (a broker
                    # restart on a loaded host) push the first round past the window, the window
                    # runs on until that round is done; and it ends SETTLE_S after the last fault.
                    end = max(end, (next_fault if self.first_round_open() else time.monotonic()) + SETTLE_S)
                self._restart_the_fallen()
                time.sleep(0.2)
        finally:
            job.signal_all(signal.SIGTERM)
            codes = job.wait_all(120)
        self.report.steps = max(job.slowest_step(), last[1])
        self.report.unplanned_exits += [f"{w} exit {c} at the stop" for w, c in codes.items() if c != 0]
        self.report.trends = self.series.trends()
        write_json_atomic(job.run_dir / "soak.json", asdict(self.report), indent=2)
        return self.report

    def first_round_open(self) -> bool:
        """Whether some kind of fault has not come yet."""
        return len(self.report.faults) < len(self.options.kinds)

    def _gap(self) -> float:
        return self.options.fault_every_s * self.random.uniform(0.5, 1.5)

    # ------------------------------------------------------------------ faults

    def _fault(self, t: float) -> None:
        job, stack = self.job, self.job.stack
        if not self.bag:  # every kind once per round, in a random order
            self.bag = self.random.sample(self.options.kinds, len(self.options.kinds))
        kind = self.bag.pop()
        cluster = self.random.choice(stack.clusters)
        if kind == "cut":
            seconds = self.random.uniform(1.0, 5.0)
            what = f"WAN cut for {seconds:.1f} s"
            stack.cut()
            time.sleep(seconds)
            stack.heal()
        elif kind == "kill":
            worker = self.random.choice(sorted(job.children))
            members = job.kill_and_restart(worker, 0.5)
            self._settle(*members)
            what = f"SIGKILL {', '.join(members)}"
        elif kind == "restart":
            stack.restart_node(cluster)
            self._settle(cluster)
            what = f"broker restart {cluster}"
        else:
            seconds = self.random.uniform(3.0, 8.0)
            what = f"memory alarm on {cluster} for {seconds:.1f} s"
            stack.rabbitmqctl(cluster, "set_vm_memory_high_watermark", ALARM_WATERMARK)
            try:
                time.sleep(seconds)
            finally:
                stack.rabbitmqctl(cluster, "set_vm_memory_high_watermark", NORMAL_WATERMARK)
        self.report.faults.append(f"{t:.0f} s: {what}")
        self.log(f"  {t:6.0f} s  {what}")

    def _restart_the_fallen(self) -> None:
        """A worker that exits on its own is an unplanned exit: reported, and restarted (with
        its group) so the soak goes on."""
        for worker in self.job.failed():
            if self.job.children[worker].poll() is None:
                continue  # restarted with another member of its group already
            code = self.job.children[worker].returncode
            self.report.unplanned_exits.append(f"{worker} exit {code}")
            self.log(f"  worker {worker} exited {code} on its own; restarting it")
            self._settle(*self.job.kill_and_restart(worker, 0.5))

    def _settle(self, *owners: str) -> None:
        for owner in owners:
            self.settling[owner] = time.monotonic() + SETTLE_S

    def _settled(self, owner: str) -> bool:
        return time.monotonic() >= self.settling.get(owner, 0.0)

    # ------------------------------------------------------------------ samples

    def _sample(self, t: float, last: tuple[float, int]) -> tuple[float, int]:
        job, add = self.job, self.series.add
        for worker, child in job.children.items():
            sample = proc_sample(child.pid) if self._settled(worker) else None
            if sample is not None:
                add(worker, "rss_mb", t, sample[0])
                add(worker, "fds", t, sample[1])
        vhost = topology.vhost(self.job_id)
        dlq = topology.dead_letter_queue(self.job_id)
        feed = topology.status_stream(self.job_id)  # kept by its retention policy: no backlog
        for cluster in job.stack.clusters:
            pid = vm_pid(job.stack.layout.node(cluster))
            sample = proc_sample(pid) if pid and self._settled(cluster) else None
            if sample is not None:
                add(cluster, "rss_mb", t, sample[0])
                add(cluster, "fds", t, sample[1])
            try:
                depths = job.stack.queue_depths(cluster, vhost)
            except StackError:
                continue  # a restarting broker has no answer: no sample, not a failure
            add(cluster, "queued", t, sum(d.messages for q, d in depths.items() if q not in (dlq, feed)))
            add(cluster, "dead_letters", t, depths[dlq].messages if dlq in depths else 0)
        # A restarted worker says step 0 until it has loaded its checkpoint: the job's progress
        # is the furthest the slowest worker has been, and a restart is a rate of 0, not below.
        now, step = time.monotonic(), max(job.slowest_step(), last[1])
        if now > last[0]:
            add("job", "steps_per_s", t, (step - last[1]) / (now - last[0]))
        return now, step


def format_soak(report: SoakReport) -> str:
    lines = [f"soak: {report.minutes:g} min, {report.steps} steps, {len(report.faults)} faults"]
    lines += [f"  {f}" for f in report.faults]
    lines.append(format_trends(report.trends))
    if report.unplanned_exits:
        lines.append(f"unplanned exits: {', '.join(report.unplanned_exits)}")
    lines.append("soak passed" if report.ok else "soak FAILED")
    return "\n".join(lines)

