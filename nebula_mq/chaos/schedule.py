"""What faults a chaos run injects, and when.

Faults fire when the slowest worker of the job reaches a step, and no worker goes more
than ``runner.HOLD_SLACK`` steps past it before it has fired (:mod:`nebula_mq.runtime.hold`),
so a schedule means the same thing on a fast, a slow and a loaded machine. Kinds:

``cut``      the WAN between the clusters is cut for ``duration_s``, then healed;
``restart``  the broker node of ``target`` (a cluster) is stopped and started;
``kill``     worker ``target`` gets SIGKILL and is started again ``duration_s`` later;
``stall``    worker ``target`` is frozen (SIGSTOP) for ``duration_s``, then resumed
             (a consumer that stops consuming without dropping its connection);
``rotate``   worker ``target``'s client certificate and its broker's server certificate are
             rotated (the old serials revoked) and the broker closes the job's connections, so
             they handshake again with the new certificates (:mod:`rotation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nebula_mq.errors import ConfigError

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
