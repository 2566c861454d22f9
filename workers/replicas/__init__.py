"""Scenario "replicas": DiLoCo across clusters, a full replica of a user's model on each.

    from workers.replicas import ReplicaSpec, run_replica
    run_replica(settings, ReplicaSpec(model=Net(), loss=mse, batch=batch), index=c)

See ``workers.replicas.job`` (the ``[replicas]`` section, flows), ``workers.replicas.outer``
(the outer step) and ``workers.replicas.replica`` (the role).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.replicas.job import ReplicaSpec

if TYPE_CHECKING:
    from nebula_mq.settings import Settings
    from nebula_mq.transport.base import Transport

__all__ = ["ReplicaSpec", "run_replica"]


def run_replica(settings: Settings, spec: ReplicaSpec, index: int, transport: Transport | None = None,
                rank: int = 0) -> int:
    """Train replica ``index`` (its cluster's, in ``[replicas] clusters``; its rank ``rank`` of
    ``[replicas] ranks``) to its end; exit code."""
    from workers.replicas.replica import run_replica as run

    return run(settings, spec, index, transport, rank)
