"""The replicas job's processes: one replica per cluster, each publishing its pseudo-gradient to
every other cluster and consuming every other cluster's (``workers.replicas.job``)."""

from __future__ import annotations

from nebula_mq.settings import Settings
from workers.processes import Plan, Process
from workers.registry import Scenario, declare
from workers.replicas.job import ROLE, ReplicasJob, load_job, replica_id


def plan(settings: Settings) -> Plan:
    """Replica ``c`` on ``clusters[c]``, with exactly its flows (least privilege); replicas share
    no group, so each restarts on its own."""
    job = load_job(settings)
    procs = tuple(Process(ROLE, cluster, replica_id(c), c, publishes=tuple(f.name for f in job.outgoing(c)),
                          consumes=tuple(f.name for f in job.incoming(c)))
                  for c, cluster in enumerate(job.clusters))
    return Plan(procs, job.flows())


SCENARIO = declare(Scenario("replicas", ReplicasJob, load_job, plan, role_modules=("replica",)))
