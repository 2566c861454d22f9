"""ABNet's processes: the decoder on T, the encoder on S, bound by request/reply flows."""

from __future__ import annotations

from nebula_mq.settings import Settings
from workers.abnet.job import load_job
from workers.processes import Plan, Process
from workers.registry import plan_builder

ROLE_MODULES = ("encoder", "decoder")


@plan_builder("abnet")
def plan(settings: Settings) -> Plan:
    job = load_job(settings)
    act, reply = job.flows()
    return Plan(
        (Process("abnet-decoder", job.tail_cluster, job.tail_id,
                 publishes=(reply.name,), consumes=(act.name,)),
         Process("abnet-encoder", job.head_cluster, job.head_id,
                 publishes=(act.name,), consumes=(reply.name,))),
        (act, reply),
    )
