"""Which worker processes a job runs, on which cluster, under which identity.

A *plan* lists the processes of a job and the flows they need; ``nebula-mq
run`` provisions the flows on the stack and starts one process per entry, and
``nebula-mq worker`` looks the role up here to find its entry point. Only
names live here: role modules are imported when a worker starts, so paddle is
never imported by a process that does not train.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from nebula_mq.errors import ConfigError
from nebula_mq.settings import Settings
from workers.electra_flows import plan as electra_plan
from workers.processes import Plan, Process

# role name -> module whose ``main(settings[, worker_index]) -> int`` runs it.
ROLES: dict[str, str] = {
    "abnet-encoder": "workers.abnet_encoder",
    "abnet-decoder": "workers.abnet_decoder",
    "electra-generator": "workers.electra_generator",
    "electra-root": "workers.electra_root",
    "electra-sub": "workers.electra_sub",
    "split-head": "workers.split_head",
    "split-tail": "workers.split_tail",
}


def _abnet(settings: Settings) -> Plan:
    from workers.abnet_common import load_job

    job = load_job(settings)
    act, reply = job.flows()
    return Plan(
        (Process("abnet-decoder", job.tgt_cluster, "dec-0",
                 publishes=(reply.name,), consumes=(act.name,)),
         Process("abnet-encoder", job.src_cluster, job.encoder_id,
                 publishes=(act.name,), consumes=(reply.name,))),
        (act, reply),
    )


def _split(settings: Settings) -> Plan:
    from workers.split_common import load_split_job

    job = load_split_job(settings)
    act, reply = job.flows()
    return Plan(
        (Process("split-tail", job.tail_cluster, job.tail_id, publishes=(reply.name,), consumes=(act.name,)),
         Process("split-head", job.head_cluster, job.head_id, publishes=(act.name,), consumes=(reply.name,))),
        (act, reply),
    )


def _electra(settings: Settings) -> Plan:
    return electra_plan(settings)  # written with the Scenario I workers


_PLANS: dict[str, Callable[[Settings], Plan]] = {"abnet": _abnet, "electra": _electra, "split": _split}


def plan_for(settings: Settings) -> Plan:
    scenario = settings.job.scenario
    if scenario not in _PLANS:
        raise ConfigError(settings.source, "job.scenario", f"one of {sorted(_PLANS)}", scenario)
    return _PLANS[scenario](settings)


def run_role(role: str, settings: Settings, index: int = 0) -> int:
    """Import the role's module and run its ``main``."""
    if role not in ROLES:
        raise ConfigError("<command line>", "--role", f"one of {sorted(ROLES)}", role)
    from nebula_mq.models.cpu import configure_cpu

    configure_cpu()  # before the role builds its model: MKL's path on AMD, this worker's threads
    main = importlib.import_module(ROLES[role]).main
    if "worker_index" in inspect.signature(main).parameters:
        return int(main(settings, worker_index=index))
    return int(main(settings))
