"""``nebula-mq chaos``: run a job cleanly, run it again under faults, compare.

Both runs use the same job file, seed and stack, as two job instances
(``<id>-clean`` and ``<id>-chaos``, each with its own vhost and run dir). The
chaos run gets the faults of a :mod:`schedule`. Afterwards the final
checkpoints of every worker are compared: equal digests mean nothing was lost
and nothing was applied twice, whatever the broker redelivered.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nebula_mq.chaos.rotation import rotate_certificates
from nebula_mq.chaos.schedule import Fault
from nebula_mq.launch import JobProcesses
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.hold import HOLD_FILE_ENV, set_hold

# How far past the next fault's step a worker may go while the injector is busy.
HOLD_SLACK = 2
COUNTERS = ("nebula_redeliveries_total", "nebula_duplicates_total", "nebula_dead_letters_total")


@dataclass
class FaultRecord:
    fault: Fault
    started: float  # unix time the fault began
    ended: float = 0.0  # unix time it was lifted (heal, restart done, process restarted, SIGCONT)
    step_at_end: int = 0  # slowest worker's step when it was lifted
    recovered_after_s: float | None = None  # lifted -> slowest worker's next step
    # Sampled while a consumer was stalled: the job's queues (messages, bytes) and the
    # largest broker RSS, to show backpressure keeps them bounded.
    max_queue_messages: int | None = None
    max_queue_bytes: int | None = None
    max_broker_rss: int | None = None


@dataclass
class ChaosReport:
    steps: int
    faults: list[FaultRecord] = field(default_factory=list)
    digests: dict[str, tuple[str, str]] = field(default_factory=dict)  # worker -> (clean, chaos)
    final_steps: dict[str, tuple[int, int]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    clean_s: float = 0.0
    chaos_s: float = 0.0
    timed_out: str = ""  # what did not finish in time ("clean run", "chaos run"); "" if all did

    @property
    def identical(self) -> bool:
        return bool(self.digests) and all(a == b for a, b in self.digests.values())

    @property
    def complete(self) -> bool:
        return (not self.timed_out and bool(self.final_steps)
                and all(a == b == self.steps for a, b in self.final_steps.values()))


def _instance(config: str, stack_dir: str, suffix: str, *, held: bool = False) -> JobProcesses:
    """The job as instance ``suffix``; ``held``: its workers obey the step hold of
    :func:`hold_file` (:mod:`nebula_mq.runtime.hold`)."""
    base = JobProcesses(config, stack_dir)
    job_id = f"{base.settings.job.id}-{suffix}"
    run_dir = base.settings.run_dir / suffix
    env = {"NEBULA__JOB__ID": job_id, "NEBULA__JOB__RUN_DIR": str(run_dir)}
    if held:
        env[HOLD_FILE_ENV] = str(hold_file(run_dir).resolve())
    return JobProcesses(config, stack_dir, env=env)


def hold_file(run_dir: Path) -> Path:
    return run_dir / "step-hold"


def _counters(job: JobProcesses, worker: str) -> dict[str, float]:
    from nebula_mq.runtime.metrics import read_metrics

    m = read_metrics(job.run_dir / "metrics" / f"{worker}.prom")
    return {k: m.get(k, 0.0) for k in COUNTERS}


def _final(job: JobProcesses, worker: str) -> tuple[int, str]:
    ck = CheckpointStore(job.run_dir / "checkpoints" / worker).latest()
    return (ck.step, ck.digest) if ck else (-1, "")


def _run_to_end(job: JobProcesses, timeout: float, tick: Callable[[], None] = lambda: None) -> None:
    deadline = time.monotonic() + timeout
    while job.running():
        if time.monotonic() > deadline:
            job.signal_all(signal.SIGKILL)
            raise TimeoutError(f"job {job.settings.job.id} did not finish in {timeout:.0f} s")
        tick()
        time.sleep(0.1)


class ChaosRunner:
    def __init__(self, config: str, stack_dir: str, schedule: Sequence[Fault],
                 log: Callable[[str], None] = print) -> None:
        self.config, self.stack_dir, self.schedule, self.log = config, stack_dir, tuple(schedule), log

    def run(self, timeout: float = 3600.0) -> ChaosReport:
        clean = _instance(self.config, self.stack_dir, "clean")
        report = ChaosReport(clean.settings.job.steps)
        t0 = time.monotonic()
        clean.provision()
        clean.start_all()
        self.log(f"clean run: job {clean.settings.job.id}")
        try:
            _run_to_end(clean, timeout)
        except TimeoutError as exc:
            report.timed_out = "clean run"
            self.log(str(exc))
        report.clean_s = time.monotonic() - t0
        chaos = _instance(self.config, self.stack_dir, "chaos", held=True)
        if not report.timed_out:
            chaos.provision()
            t0 = time.monotonic()
            hold = hold_file(chaos.run_dir)
            hold.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._inject_all(chaos, report, timeout, hold)
            except TimeoutError as exc:  # the report still says how far each worker got
                report.timed_out = "chaos run"
                self.log(str(exc))
            finally:
                set_hold(hold, None)
            report.chaos_s = time.monotonic() - t0
        for proc in chaos.plan.processes:
            w = proc.worker_id
            for k, v in _counters(chaos, w).items():
                report.counters[k] = report.counters.get(k, 0.0) + v
            (cs, cd), (xs, xd) = _final(clean, w), _final(chaos, w)
            report.digests[w] = (cd, xd)
            report.final_steps[w] = (cs, xs)
        chaos.run_dir.mkdir(parents=True, exist_ok=True)
        self._write(chaos, report)
        return report

    def _inject_all(self, job: JobProcesses, report: ChaosReport, timeout: float, hold: Path) -> None:
        """Start the job and inject each fault once the slowest worker reaches its step. No
        worker goes more than ``HOLD_SLACK`` steps past the next fault's step before that fault
        is in: a fault that blocks this loop (a broker restart, a long cut or stall) cannot let
        the job end first and skip the faults after it."""
        last = job.settings.job.steps - 1
        pending = sorted((f for f in self.schedule if f.at_step <= last), key=lambda f: f.at_step)
        for fault in self.schedule:
            if fault.at_step > last:  # held before the last step, the job would wait for it for ever
                self.log(f"not injected (planned after the job's last step but one): {fault.describe()}")
        open_records: list[FaultRecord] = []

        def hold_for_next() -> None:
            # A fault planned near the end still comes before the last step.
            set_hold(hold, min(pending[0].at_step + HOLD_SLACK, last) if pending else None)

        def tick() -> None:
            step = job.slowest_step()
            for rec in open_records[:]:
                if step > rec.step_at_end:
                    rec.recovered_after_s = time.time() - rec.ended
                    open_records.remove(rec)
            while pending and step >= pending[0].at_step:
                fault = pending.pop(0)
                hold_for_next()
                rec = self._inject(job, fault, report)
                rec.step_at_end = job.slowest_step()
                report.faults.append(rec)
                open_records.append(rec)
            for w in job.failed():  # a worker that dies on its own is restarted, and reported
                if job.children[w].poll() is None:
                    continue  # restarted already, with another member of its group
                members = job.group_of(w)
                self.log(f"worker {w} exited {job.children[w].returncode}; restarting "
                         + (w if len(members) == 1 else f"its group {', '.join(members)}"))
                job.kill_and_restart(w)

        hold_for_next()
        job.start_all()
        self.log(f"chaos run: job {job.settings.job.id}, {len(self.schedule)} faults")
        _run_to_end(job, timeout, tick)  # faults lifted after the last step stay "-"
        for fault in pending:
            self.log(f"not injected (the job ended first): {fault.describe()}")

    def _inject(self, job: JobProcesses, fault: Fault, report: ChaosReport) -> FaultRecord:
        rec = FaultRecord(fault, time.time())
        self.log(f"inject {fault.describe()}")
        if fault.kind == "cut":
            job.stack.cut()
            time.sleep(fault.duration_s)
            job.stack.heal()
        elif fault.kind == "restart":
            job.stack.restart_node(fault.target)
        elif fault.kind == "kill":
            # The target's gloo group (Scenario I discriminators) is killed and started with
            # it: a rank restarted alone would wait for ever in the group's rendezvous.
            for member in job.group_of(fault.target):
                for k, v in _counters(job, member).items():  # counters die with the process
                    report.counters[k] = report.counters.get(k, 0.0) + v
            members = job.kill_and_restart(fault.target, fault.duration_s)
            if len(members) > 1:
                self.log(f"  restarted its group with it: {', '.join(members)}")
        elif fault.kind == "stall":
            job.signal(fault.target, signal.SIGSTOP)
            end = time.monotonic() + fault.duration_s
            while time.monotonic() < end:
                self._sample(job, rec)
                time.sleep(max(0.0, min(5.0, end - time.monotonic())))
            job.signal(fault.target, signal.SIGCONT)
        elif fault.kind == "rotate":
            self.log("  " + rotate_certificates(job, fault.target))
        rec.ended = time.time()
        return rec

    @staticmethod
    def _sample(job: JobProcesses, rec: FaultRecord) -> None:
        from nebula_mq import topology
        from nebula_mq.errors import StackError

        vhost = topology.vhost(job.settings.job.id)
        msgs = size = rss = 0
        try:
            for cluster in job.stack.clusters:
                depths = job.stack.queue_depths(cluster, vhost)
                msgs += sum(d.messages for d in depths.values())
                size += sum(d.message_bytes for d in depths.values())
                status = json.loads(job.stack.rabbitmqctl(cluster, "status", "--formatter", "json"))
                rss = max(rss, int(status.get("memory", {}).get("total", {}).get("rss", 0)))
        except (StackError, ValueError, TypeError, AttributeError):
            return  # a sample lost to a busy node is not a fault of the job
        rec.max_queue_messages = max(msgs, rec.max_queue_messages or 0)
        rec.max_queue_bytes = max(size, rec.max_queue_bytes or 0)
        rec.max_broker_rss = max(rss, rec.max_broker_rss or 0)

    def _write(self, job: JobProcesses, report: ChaosReport) -> None:
        with (job.run_dir / "faults.jsonl").open("w") as fh:
            for rec in report.faults:
                fh.write(json.dumps({"time": rec.started, "ended": rec.ended, "kind": rec.fault.kind,
                                     "target": rec.fault.target, "duration_s": rec.fault.duration_s,
                                     "recovered_after_s": rec.recovered_after_s}) + "\n")
        body: dict[str, Any] = asdict(report)
        body.update(identical=report.identical, complete=report.complete)
        (job.run_dir / "chaos.json").write_text(json.dumps(body, indent=1, default=str))


def format_report(report: ChaosReport) -> str:
    lines = [f"{'fault':<44}{'recovered after':>16}"]
    for rec in report.faults:
        rec_s = "-" if rec.recovered_after_s is None else f"{rec.recovered_after_s:.2f} s"
        lines.append(f"{rec.fault.describe():<44}{rec_s:>16}")
        if rec.max_queue_messages is not None:
            lines.append(f"    during the stall: queues <= {rec.max_queue_messages} messages / "
                         f"{rec.max_queue_bytes} bytes, broker RSS <= {(rec.max_broker_rss or 0) / 2**20:.0f} MiB")
    lines.append("")
    lines.append(f"runs: clean {report.clean_s:.0f} s, chaos {report.chaos_s:.0f} s")
    if report.timed_out:
        lines.append(f"TIMED OUT: the {report.timed_out} did not finish (its workers were killed); "
                     "see the workers' logs")
    lines.append("messages redelivered {:.0f}, discarded as duplicates {:.0f}, dead-lettered {:.0f}".format(
        *(report.counters.get(k, 0.0) for k in COUNTERS)))
    for w, (clean, chaos) in report.digests.items():
        same = "identical" if clean == chaos else "DIFFERENT"
        steps = report.final_steps[w]
        lines.append(f"{w}: step {steps[1]}/{report.steps}  clean {clean[:16]}  chaos {chaos[:16]}  {same}")
    lost = "0" if report.complete else "SOME (a worker did not reach the last step)"
    twice = "0" if report.identical else "UNKNOWN (final states differ)"
    lines.append(f"lost: {lost}; applied twice: {twice}; "
                 f"final checkpoints {'bit-identical' if report.identical else 'DIFFER'}")
    return "\n".join(lines)
