"""The split job's processes: a user's model cut in two, tail ranks on T, head ranks on S."""

from __future__ import annotations

from nebula_mq import topology
from nebula_mq.settings import Settings
from workers.processes import Plan, Process
from workers.registry import Scenario, declare
from workers.split.job import HEAD_ROLE, TAIL_ROLE, Placement, SplitJob, load_split_job


def side_processes(job: Placement, head_role: str, tail_role: str) -> Plan:
    """Every rank of both sides, each with exactly its flows (least privilege): head rank
    ``i`` publishes to every tail rank and consumes its own replies; tail rank ``j``
    consumes its own activations and replies to every head rank. The ranks of a side
    form one gloo group, so they stop and start together."""
    acts, replies = job.activation_flows(), job.reply_flows()

    def names(*flows: topology.Flow) -> tuple[str, ...]:  # every stripe: what the broker sees
        return tuple(f.name for f in topology.physical_flows(flows))

    tails = tuple(Process(tail_role, job.tail_cluster, wid, j, publishes=names(*replies), consumes=names(acts[j]),
                          restart_group="tail" if job.tail_ranks > 1 else "",
                          host=job.tail_hosts[j] if job.tail_hosts else "")
                  for j, wid in enumerate(job.tail_ids()))
    heads = tuple(Process(head_role, job.head_cluster, wid, i, publishes=names(*acts), consumes=names(replies[i]),
                          restart_group="head" if job.head_ranks > 1 else "",
                          host=job.head_hosts[i] if job.head_hosts else "")
                  for i, wid in enumerate(job.head_ids()))
    return Plan(tails + heads, topology.physical_flows(job.flows()))


def plan(settings: Settings) -> Plan:
    return side_processes(load_split_job(settings), HEAD_ROLE, TAIL_ROLE)


SCENARIO = declare(Scenario("split", SplitJob, load_split_job, plan, role_modules=("head", "tail"),
                            framework=""))
