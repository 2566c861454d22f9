"""Restarting the workers of a job that die on their own (``nebula-mq run --restarts N``).

A week-long job should not need someone watching it. When a worker exits with a
failure while no stop was asked for, its restart group (the worker, or every
rank of its gloo group: a rank cannot rejoin a group alone) is killed and
started again; it resumes from its checkpoints, and the broker redelivers what
came after them (nothing lost, nothing applied twice). The policy:

* at most ``budget`` restarts for the whole run;
* a pause before each restart that doubles each time the same group fails
  again (1, 2, 4 ... s, at most :data:`MAX_PAUSE_S`), so a broker that is down
  for a while is not hammered;
* a worker that stopped with an error of the job's own (its config, data, model
  or placement: ``NebulaError.restart_helps`` is false) is not restarted at all;
* a group that fails again without having made a step since its last restart
  is not restarted: the failure repeats, and restarting would only hide it.

Whatever happens to a failed worker, the console gets its one-line reason, read
back from its log (``launch.logpipe.exit_reason``), and the log's path.

Every restart is written to the job's ``faults.jsonl`` (kind ``restart``, the
worker, and how long after the restart its group made its next step), where
the report shows it beside injected faults.

:func:`supervise` is the loop around the running job: it shows the slowest
worker's step, forwards Ctrl-C or SIGTERM to the workers as SIGTERM (a second
Ctrl-C, or :data:`STOP_GRACE_S` without an exit, kills them), applies the
restart policy to workers that die on their own and stops the job at its
timeout. Its :class:`Outcome` says how the run ended and with which exit code.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nebula_mq.launch.logpipe import ExitReason

if TYPE_CHECKING:
    from nebula_mq.launch.processes import JobProcesses

MAX_PAUSE_S = 30.0
# Exit codes of a worker stopped by a signal someone sent (not restarted).
ASKED_TO_STOP = (130, 143, -signal.SIGINT, -signal.SIGTERM)
# Exit codes of workers a second Ctrl-C stopped at once: they did what was asked.
FORCED = (130, -signal.SIGINT, -signal.SIGKILL)
# How long workers get to finish their micro-batch and checkpoint after a stop request.
STOP_GRACE_S = 120.0
# How long the job may make no step before the console says so, and why (then as often).
STALL_S = 30.0


class Restartable(Protocol):
    def group_of(self, worker_id: str) -> tuple[str, ...]: ...

    def steps(self) -> dict[str, int]: ...

    def kill_and_restart(self, worker_id: str, pause_s: float = 0.0) -> tuple[str, ...]: ...


@dataclass
class RestartPolicy:
    budget: int
    say: Callable[[str], None] = print
    made: int = 0
    # Per restart group (its first member): the group's step when it was last restarted,
    # and how many times in a row it has failed.
    restarted_at: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    # Where restarts are recorded (the job's faults.jsonl), and those not yet recovered:
    # (worker, its group, unix time of the restart, the group's step then).
    faults_log: Path | None = None
    pending: list[tuple[str, tuple[str, ...], float, int]] = field(default_factory=list)

    def restart(self, job: Restartable, worker: str, code: int | None) -> bool:
        """Restart ``worker``'s group if the policy allows (True); False: the job must stop."""
        members = job.group_of(worker)
        key = members[0]
        steps = job.steps()
        step = min(steps.get(m, 0) for m in members)
        who = worker if len(members) == 1 else f"{worker} (with its group: {', '.join(members)})"
        if self.made >= self.budget:
            self.say(f"worker {worker} exited {code}; no restarts left ({self.budget} made): stopping the job")
            return False
        if key in self.restarted_at and step <= self.restarted_at[key]:
            self.say(f"worker {worker} exited {code} again without a step since its restart (step {step}): "
                     "not restarting it")
            return False
        self.failures[key] = self.failures.get(key, 0) + 1 if key in self.restarted_at else 1
        pause = min(MAX_PAUSE_S, 2.0 ** (self.failures[key] - 1))
        self.made += 1
        self.say(f"worker {worker} exited {code} at step {step}: restarting {who} in {pause:g} s "
                 f"(restart {self.made} of {self.budget}); it resumes from its checkpoint")
        job.kill_and_restart(worker, pause)
        self.restarted_at[key] = step
        self.pending.append((worker, members, time.time(), step))
        return True

    def poll(self, steps: Mapping[str, int]) -> None:
        """Record the restarts whose group has made a step since (recovered); ``steps``: each
        worker's step now."""
        for item in list(self.pending):
            worker, members, at, step = item
            if min(steps.get(m, 0) for m in members) > step:
                self.pending.remove(item)
                self._record(worker, at, time.time() - at)

    def close(self) -> None:
        """Record the restarts that had not recovered when the run ended."""
        for worker, _, at, _ in self.pending:
            self._record(worker, at, None)
        self.pending.clear()

    def _record(self, worker: str, at: float, recovered_after_s: float | None) -> None:
        if self.faults_log is None:
            return
        self.faults_log.parent.mkdir(parents=True, exist_ok=True)
        with self.faults_log.open("a") as fh:
            fh.write(json.dumps({"time": at, "ended": at, "kind": "restart", "target": worker, "duration_s": 0.0,
                                 "recovered_after_s": recovered_after_s}, sort_keys=True) + "\n")


@dataclass
class StallWatch:
    """No wait is silent for long: when no worker has made a step for :data:`STALL_S` seconds,
    and as often while it lasts, say so with why (``JobProcesses.stall_lines``). A job whose
    steps take long (a big model) is not called stalled while no worker says it waits, until
    three of its longest steps have passed."""

    say: Callable[[str], None]
    steps: dict[str, int] = field(default_factory=dict)
    moved_at: float = field(default_factory=time.monotonic)
    told_at: float = 0.0
    longest: float = 0.0  # the longest time between two moves, the start's excluded

    def watch(self, steps: dict[str, int], why: Callable[[], list[str]]) -> None:
        now = time.monotonic()
        if steps != self.steps:
            if self.steps and any(self.steps.values()):
                self.longest = max(self.longest, now - self.moved_at)
            self.steps, self.moved_at = dict(steps), now
            return
        quiet = now - self.moved_at
        if quiet < STALL_S or now - self.told_at < STALL_S:
            return
        lines = why()
        if not lines and quiet < 3 * self.longest:
            return  # a long step, most likely: nobody says it waits
        self.told_at = now
        self.say(f"no step for {quiet:.0f} s" + (":" if lines else " (no worker says it waits)"))
        for line in lines:
            self.say(f"  {line}")


@dataclass(frozen=True)
class Outcome:
    """How a supervised run ended: whether a signal stopped it, the signals received, in
    order, what failed (workers, and reasons such as ``timeout`` or ``stop grace exceeded``),
    and why each failed worker stopped."""

    interrupted: bool
    signals: tuple[int, ...]
    failed: tuple[str, ...]
    # One line per failed worker: who (and its cluster), why, and its log.
    why: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        """1 when something failed; after a signal, :func:`interrupted_exit_code`; else 0."""
        if self.failed:
            return 1
        return interrupted_exit_code(list(self.signals)) if self.interrupted else 0


def interrupted_exit_code(signals: list[int]) -> int:
    """The shell's convention for a run ended by a signal: 128 + the first one received
    (130 after Ctrl-C, 143 after SIGTERM)."""
    return 128 + int(signals[0] if signals else signal.SIGINT)


@dataclass
class Periodic:
    """Something the supervisor does every ``every_s`` seconds while the job runs (the first
    time ``every_s`` after it starts): a broker host's ``up`` reads its peers' CRLs again."""

    every_s: float
    run: Callable[[], None]
    last: float = field(default_factory=time.monotonic)

    def due(self) -> None:
        if time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            self.run()


def supervise(job: JobProcesses, timeout: float | None, restarts: int, say: Callable[[str], None],
              tasks: Sequence[Periodic] = ()) -> Outcome:
    """Watch ``job``'s started workers until none runs (see the module docstring); ``say``
    gets each line about stopping and restarting; ``tasks`` run when due. SIGINT and SIGTERM
    handlers are this loop's while it runs."""
    from nebula_mq.runtime.progress import progress
    from nebula_mq.runtime.signals import StopFlag

    # The handler only records the signal (see nebula_mq.runtime.signals); this loop
    # forwards it. A second Ctrl-C kills the workers: each one's last checkpoint
    # stands and the broker redelivers what came after it when the job is run again.
    received = StopFlag()

    def _on_signal(signum: int, _frame: Any) -> None:
        received.signals.append(signum)
        received.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = None if timeout is None else time.monotonic() + timeout
    reasons: list[str] = []  # why the job was stopped, besides failed workers
    why: dict[str, ExitReason] = {}  # each worker that failed: why, as its log says
    stopping = killed = False
    stop_since = 0.0
    policy = RestartPolicy(max(0, restarts), say=say, faults_log=job.run_dir / "faults.jsonl")
    stall = StallWatch(say)
    try:
        with progress(job.settings.job.steps, "training (slowest worker)") as bar:
            done = 0
            while job.running():
                if received.is_set() and not stopping:
                    stopping = True
                    say("stopping: workers finish their micro-batch and checkpoint (Ctrl-C again to kill them now)")
                    job.signal_all(signal.SIGTERM)
                stop_since = stop_since or (time.monotonic() if stopping else 0.0)
                if received.signals.count(signal.SIGINT) >= 2 and not killed:
                    killed = True
                    say("second interrupt: killing the workers")
                    job.signal_all(signal.SIGKILL)
                elif stop_since and time.monotonic() - stop_since > STOP_GRACE_S and not killed:
                    # A rank blocked in a collective whose peer died never sees SIGTERM.
                    killed = True
                    say(f"workers still running {STOP_GRACE_S:.0f} s after the stop request: "
                        f"killing them ({', '.join(w for w, c in job.children.items() if c.poll() is None)})")
                    reasons.append("stop grace exceeded")
                    job.signal_all(signal.SIGKILL)
                time.sleep(0.2)
                if not stopping:
                    restarted = job.follow_group_restarts()
                    if restarted:
                        say(f"restarting {', '.join(restarted)}: another host restarted their group")
                statuses = job.statuses()  # one read of the status files per tick
                policy.poll(job.steps(statuses))
                slowest = job.slowest_step(statuses)
                if not stopping:
                    stall.watch(job.steps(statuses), lambda: job.stall_lines(statuses))
                    for task in tasks:
                        task.due()
                loss = job.loss(statuses)
                if loss is not None:
                    bar.set_postfix(loss=loss)
                bar.set_phase(job.phase(statuses))
                bar.update(max(0, slowest - done))
                done = max(done, slowest)
                # Not while stopping, nor for a worker a signal stopped: a terminal's Ctrl-C reaches
                # the workers too, sometimes before this loop has seen it.
                for worker in job.failed() if not (stopping or received.is_set()) else ():
                    code = job.children[worker].poll()
                    if code is None:
                        continue  # restarted already, with another member of its group
                    if code in ASKED_TO_STOP or not restarted_after_failure(job, worker, code, policy, why, say):
                        stopping = True
                        job.signal_all(signal.SIGTERM)
                        break
                if deadline is not None and time.monotonic() > deadline and not stopping:
                    say(f"timeout after {timeout:.0f} s: stopping workers")
                    reasons.append("timeout")
                    stopping = True
                    job.signal_all(signal.SIGTERM)
    finally:
        policy.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        job.drain_logs()  # the workers' last lines are in their logs when the run reports
        if not job.running():
            job.release_claims()
    interrupted = received.is_set()
    failed = [w for w in job.failed() if not (interrupted and job.children[w].returncode in FORCED)]
    lines = tuple(f"{job.named(w)}: {(why.get(w) or job.exit_reason(w)).text}; log: {job.log_of(w)}"
                  for w in failed)
    return Outcome(interrupted, tuple(received.signals), tuple(reasons + failed), lines)


def restarted_after_failure(job: JobProcesses, worker: str, code: int, policy: RestartPolicy,
                            why: dict[str, ExitReason], say: Callable[[str], None]) -> bool:
    """Say why ``worker`` stopped (its one line, its log), and restart its group when a restart
    can help and the policy allows; False: the job stops."""
    reason = why[worker] = job.exit_reason(worker)
    say(f"{job.named(worker)}: {reason.text}")
    say(f"  log: {job.log_of(worker)}")
    if not reason.restart_helps:
        say(f"not restarting {worker}: it would stop the same way (the job's config, data, model or "
            "placement needs fixing first); stopping the job")
        return False
    return policy.restart(job, worker, code)
