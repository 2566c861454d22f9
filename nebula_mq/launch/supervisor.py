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
* a group that fails again without having made a step since its last restart
  is not restarted: the failure repeats (bad data, a mistake in the job file),
  and restarting would only hide it.

Every restart is written to the job's ``faults.jsonl`` (kind ``restart``, the
worker, and how long after the restart its group made its next step), where
the report shows it beside injected faults.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

MAX_PAUSE_S = 30.0


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
                     "not restarting it; see its log")
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
