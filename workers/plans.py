"""Which worker processes a job runs, and how a worker finds its role.

A *plan* lists the processes of a job and the flows they need; ``nebula-mq
run`` provisions the flows on the stack and starts one process per entry, and
``nebula-mq worker`` looks the role up to find its entry point. Both come from
the scenario's own subpackage (``workers.registry``): role modules are imported
only when a worker starts, so paddle is never imported by a process that does
not train.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from nebula_mq import topology
from nebula_mq.settings import ClusterSettings, Settings
from workers.processes import Plan, Process
from workers.registry import plan_for, role_main, scenario_of

__all__ = ["Plan", "Process", "plan_for", "run_role", "with_stack_broker"]


def with_stack_broker(settings: Settings, stack: Any, proc: Process, host: str = "") -> Settings:
    """``settings`` whose broker of ``proc``'s cluster is the local ``stack``'s node, reached as
    ``proc``'s identity (issued there) on loopback, or by ``host``, a name in its certificate
    (a rank on another host of the cluster)."""
    broker = stack.broker_settings(proc.cluster, proc.identity(settings.job.id), vhost=topology.vhost(settings.job.id),
                                   host=host)
    return dataclasses.replace(settings, clusters={**settings.clusters, proc.cluster: ClusterSettings(proc.cluster, broker)})


def run_role(role: str, settings: Settings, index: int = 0) -> int:
    """Run role ``role`` of the job (``index``: its rank among processes of the same role)."""
    from nebula_mq.models.cpu import configure_cpu

    # Before the role's module loads its framework's math: MKL's path on AMD, this worker's threads.
    configure_cpu(paddle=scenario_of(settings).framework == "paddle")
    main = role_main(settings, role)
    if "worker_index" in inspect.signature(main).parameters:
        return int(main(settings, worker_index=index))
    return int(main(settings))
