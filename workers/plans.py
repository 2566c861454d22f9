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
from dataclasses import dataclass

from nebula_mq import topology
from nebula_mq.errors import ConfigError
from nebula_mq.settings import Settings

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


@dataclass(frozen=True)
class Process:
    role: str
    cluster: str
    # Unique within the job: names checkpoints, logs, metrics and the TLS identity.
    worker_id: str
    # Index among the processes of the same role (sub-discriminator rank, generator group).
    index: int = 0
    # Flow names it publishes to and consumes from: its broker permissions are exactly
    # these (least privilege). Both empty: job-wide permissions (tools, older plans).
    publishes: tuple[str, ...] = ()
    consumes: tuple[str, ...] = ()
    # Processes with the same non-empty group stop and start together: a gloo group has
    # no membership change, so one rank restarted alone waits for ever in the rendezvous.
    restart_group: str = ""

    def identity(self, job_id: str) -> str:
        """Certificate CN this process logs in with (EXTERNAL auth)."""
        return f"{job_id}.{self.worker_id}"

    def broker_identity(self, job_id: str) -> str:
        """The CN, carrying the role's flows when known (see ``nebula_mq.security.roles``)."""
        from nebula_mq.security.roles import WorkerIdentity

        if not (self.publishes or self.consumes):
            return self.identity(job_id)
        return WorkerIdentity(self.identity(job_id), self.publishes, self.consumes)


@dataclass(frozen=True)
class Plan:
    processes: tuple[Process, ...]
    flows: tuple[topology.Flow, ...]

    def identities(self, job_id: str) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for p in self.processes:
            out.setdefault(p.cluster, []).append(p.broker_identity(job_id))
        return {c: tuple(ids) for c, ids in out.items()}

    def find(self, role: str, index: int = 0) -> Process:
        for p in self.processes:
            if p.role == role and p.index == index:
                return p
        raise ConfigError("<plan>", "role", f"one of {sorted({p.role for p in self.processes})}",
                          f"{role}#{index}")


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
    from workers.electra_flows import plan  # written with the Scenario I workers

    return plan(settings)


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
