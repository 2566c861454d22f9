"""Which worker processes a job runs, and how a worker finds its role.

A *plan* lists the processes of a job and the flows they need; ``nebula-mq
run`` provisions the flows on the stack and starts one process per entry, and
``nebula-mq worker`` looks the role up to find its entry point. Both come from
the scenario's own subpackage (``workers.registry``): role modules are imported
only when a worker starts, so paddle is never imported by a process that does
not train.
"""

from __future__ import annotations

import inspect

from nebula_mq.settings import Settings
from workers.processes import Plan, Process
from workers.registry import plan_for, role_main, scenario_of

__all__ = ["Plan", "Process", "plan_for", "run_role"]


def run_role(role: str, settings: Settings, index: int = 0) -> int:
    """Run role ``role`` of the job (``index``: its rank among processes of the same role)."""
    from nebula_mq.models.cpu import configure_cpu

    # Before the role's module loads its framework's math: MKL's path on AMD, this worker's threads.
    configure_cpu(paddle=scenario_of(settings).framework == "paddle")
    main = role_main(settings, role)
    if "worker_index" in inspect.signature(main).parameters:
        return int(main(settings, worker_index=index))
    return int(main(settings))
