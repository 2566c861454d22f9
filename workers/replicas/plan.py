"""The replicas job's processes: one replica per cluster, each publishing its pseudo-gradient to
every other cluster and consuming every other cluster's (``workers.replicas.job``)."""

from __future__ import annotations

from nebula_mq.settings import Settings
from workers.processes import Plan, Process
from workers.registry import Scenario, declare
from workers.replicas.job import ROLE, ReplicasJob, load_job, replica_id


def plan(settings: Settings) -> Plan:
    """Replica ``c``'s rank ``r`` on ``clusters[c]`` (process index ``c * ranks + r``; ``up
    --ranks r`` on its host), with exactly its flows (least privilege); the replicas of
    different clusters share no group, so each restarts on its own, and a cluster's ranks (one
    gloo group) restart together."""
    job = load_job(settings)
    procs = tuple(Process(ROLE, cluster, replica_id(c, r), c * job.ranks + r,
                          publishes=tuple(f.name for f in job.outgoing(c, r)),
                          consumes=tuple(f.name for f in job.incoming(c, r)),
                          restart_group=f"replica-{c}" if job.ranks > 1 else "", rank_in_cluster=r,
                          host=job.hosts[cluster][r] if cluster in job.hosts else "")
                  for c, cluster in enumerate(job.clusters) for r in range(job.ranks))
    return Plan(procs, job.flows())


SCENARIO = declare(Scenario("replicas", ReplicasJob, load_job, plan, role_modules=("replica",),
                            framework=""))
