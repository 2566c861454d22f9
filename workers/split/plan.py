"""The split job's processes: a user's model cut in two, tail on T, head on S."""

from __future__ import annotations

from nebula_mq.settings import Settings
from workers.processes import Plan, Process
from workers.registry import plan_builder
from workers.split.job import load_split_job

ROLE_MODULES = ("head", "tail")


@plan_builder("split")
def plan(settings: Settings) -> Plan:
    job = load_split_job(settings)
    act, reply = job.flows()
    return Plan(
        (Process("split-tail", job.tail_cluster, job.tail_id, publishes=(reply.name,), consumes=(act.name,)),
         Process("split-head", job.head_cluster, job.head_id, publishes=(act.name,), consumes=(reply.name,))),
        (act, reply),
    )
