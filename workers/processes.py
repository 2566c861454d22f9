"""What a job runs: its processes (role, cluster, identity, flows) and the flows they share."""

from __future__ import annotations

from dataclasses import dataclass

from nebula_mq import topology
from nebula_mq.errors import ConfigError


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
    # Its rank among its cluster's processes of its role, where that is not ``index`` (a
    # replicas job indexes every cluster's ranks in one sequence): what ``up --ranks`` names.
    rank_in_cluster: int | None = None
    # The host the job file places it on (a name or address; "" = wherever it is started):
    # started elsewhere, it is refused before it touches the job (``workers.claim``).
    host: str = ""

    @property
    def cluster_rank(self) -> int:
        return self.index if self.rank_in_cluster is None else self.rank_in_cluster

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

    @property
    def clusters(self) -> frozenset[str]:
        """Every cluster the job's processes run on or its flows cross."""
        return frozenset({p.cluster for p in self.processes} | {c for f in self.flows
                                                                 for c in (f.src_cluster, f.dst_cluster)})

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
