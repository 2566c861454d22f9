"""``nebula-mq chaos``: run a job cleanly, run it again under faults, compare.

Both runs use the same job file, seed and stack, as two job instances
(``<id>-clean`` and ``<id>-chaos``, each with its own vhost and run dir). The
chaos run gets the faults of a schedule. Afterwards the final
checkpoints of every worker are compared: equal digests mean nothing was lost
and nothing was applied twice, whatever the broker redelivered.

A fault (:class:`Fault`) fires when the slowest worker of the job reaches its step, and no worker
goes more than :data:`HOLD_SLACK` steps past it before it has fired (:mod:`nebula_mq.runtime.hold`),
so a schedule means the same thing on a fast, a slow and a loaded machine. Kinds:

``cut``      the WAN between the clusters is cut for ``duration_s``, then healed;
``restart``  the broker node of ``target`` (a cluster) is stopped and started;
``kill``     worker ``target`` gets SIGKILL and is started again ``duration_s`` later;
``stall``    worker ``target`` is frozen (SIGSTOP) for ``duration_s``, then resumed
             (a consumer that stops consuming without dropping its connection);
``rotate``   worker ``target``'s client certificate and its broker's server certificate get
             new keys and certificates (``nebula-mq certs rotate``: the old serials revoked,
             recorded in the job's audit log), and the broker closes the job's connections
             (:func:`rotate_certificates`).

A rotation loses nothing: each connection of the worker handshakes again with its new files (the
transport reads them at every handshake) and the peers' federation links into that broker verify
its new certificate (the broker reads it at every handshake); what was unacked on a closed
connection is delivered again, and what was unconfirmed is published again.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from nebula_mq import topology
from nebula_mq.errors import ConfigError, StackError
from nebula_mq.launch import JobProcesses
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.hold import HOLD_FILE_ENV, set_hold
from nebula_mq.security import lifecycle
from nebula_mq.security.audit import AuditLog

# How far past the next fault's step a worker may go while the injector is busy.
HOLD_SLACK = 2
COUNTERS = ("nebula_redeliveries_total", "nebula_duplicates_total", "nebula_dead_letters_total")

Kind = Literal["cut", "restart", "kill", "stall", "rotate"]


@dataclass(frozen=True)
class Fault:
    at_step: int  # fires once the slowest worker has reached this step
    kind: Kind
    # Cluster name (restart), worker id (kill, stall, rotate), or "" for the WAN (cut).
    target: str = ""
    duration_s: float = 0.0

    def describe(self) -> str:
        what = {"cut": "WAN cut", "restart": "broker restart", "kill": "SIGKILL",
                "stall": "consumer stall", "rotate": "certificate rotation"}[self.kind]
        target = f" {self.target}" if self.target else ""
        span = f" for {self.duration_s:g} s" if self.duration_s else ""
        return f"step {self.at_step}: {what}{target}{span}"


def default_schedule(steps: int, clusters: tuple[str, str], workers: tuple[str, str],
                     cut_s: tuple[float, ...] = (5, 10, 20, 30, 60), stall_s: float = 120.0,
                     restart_cluster: str | None = None, rotate: bool = False) -> tuple[Fault, ...]:
    """Five cuts, one broker restart, one SIGKILL on each side and one long stall,
    spread evenly over the job (the issue's acceptance run); with ``rotate``, the first
    worker's certificate and its broker's rotated after the stall."""
    if steps < 20:
        raise ConfigError("<chaos>", "steps", "at least 20 steps to spread the faults over", steps)
    plan: list[tuple[Kind, str, float]] = [("cut", "", s) for s in cut_s]
    plan.insert(2, ("kill", workers[0], 1.0))
    plan.insert(4, ("restart", restart_cluster or clusters[1], 0.0))
    plan.insert(6, ("kill", workers[1], 1.0))
    plan.append(("stall", workers[1], stall_s))
    if rotate:
        plan.append(("rotate", workers[0], 0.0))
    # Spread over the first 70% of the job: the steps after the last fault show the recovery.
    gap = max(1, int(steps * 0.7) // len(plan))
    return tuple(Fault(1 + i * gap, kind, target, dur) for i, (kind, target, dur) in enumerate(plan))


def rotate_certificates(job: JobProcesses, worker_id: str) -> str:
    """Rotate ``worker_id``'s certificate and its broker's, then make every connection of the
    job on that broker handshake again; returns what was done, for the injector's log."""
    procs = {p.worker_id: p for p in job.plan.processes}
    if worker_id not in procs:
        raise ConfigError("<chaos>", "rotate target", f"a worker of the job, one of {sorted(procs)}", worker_id)
    proc = procs[worker_id]
    certs = job.stack.layout.certs_dir
    audit = AuditLog(job.run_dir / "audit" / "audit.jsonl")
    client = lifecycle.rotate(certs, proc.cluster, proc.identity(job.settings.job.id), audit)
    lifecycle.rotate(certs, proc.cluster, "server", audit)
    job.stack.rabbitmqctl(proc.cluster, "close_all_connections", "--vhost", topology.vhost(job.settings.job.id),
                          "certificates rotated")
    return f"{proc.cluster}: rotated {client.cn} and the broker's certificate, closed the job's connections"


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


def job_instance(config: str, stack_dir: str, suffix: str, *, held: bool = False,
                 steps: int | None = None) -> JobProcesses:
    """The job as instance ``<id>-<suffix>``, in ``<run_dir>/<suffix>``; ``held``: its workers
    obey the step hold of :func:`hold_file` (:mod:`nebula_mq.runtime.hold`); ``steps``: its
    number of steps, when not the job's own."""
    base = JobProcesses(config, stack_dir)
    run_dir = base.settings.run_dir / suffix
    env = {"NEBULA__JOB__ID": f"{base.settings.job.id}-{suffix}", "NEBULA__JOB__RUN_DIR": str(run_dir)}
    if held:
        env[HOLD_FILE_ENV] = str(hold_file(run_dir).resolve())
    if steps is not None:
        env["NEBULA__JOB__STEPS"] = str(steps)
    return JobProcesses(config, stack_dir, env=env)


def hold_file(run_dir: Path) -> Path:
    return run_dir / "step-hold"


def _add_counters(report: ChaosReport, job: JobProcesses, worker: str) -> None:
    """Add ``worker``'s :data:`COUNTERS` (its metrics file) to the report's."""
    from nebula_mq.runtime.metrics import read_metrics

    m = read_metrics(job.run_dir / "metrics" / f"{worker}.prom")
    for k in COUNTERS:
        report.counters[k] = report.counters.get(k, 0.0) + m.get(k, 0.0)


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
        clean = job_instance(self.config, self.stack_dir, "clean")
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
        chaos = job_instance(self.config, self.stack_dir, "chaos", held=True)
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
            _add_counters(report, chaos, w)
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
                _add_counters(report, job, member)  # counters die with the process
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
