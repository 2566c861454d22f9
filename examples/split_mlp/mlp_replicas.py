"""The example's MLP (mlp.py: bottom then top, in Paddle) as one whole model, for a replicas
job: every cluster trains a full replica on its own shard of the data (mlp_data.py).

    nebula-mq run config/replicas.toml --stack run/stack-3    # [replicas] model = "mlp_replicas:build_replica"
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from paddle import nn

from mlp import bottom, top
from mlp_data import BATCH, SAMPLES, dataset

from nebula_mq.settings import Settings
from workers.replicas.job import ReplicaSpec, load_job

Batch = tuple[tuple[np.ndarray], tuple[np.ndarray]]


def whole() -> nn.Layer:
    """The split example's two halves as one model, built the same on every cluster."""
    return nn.Sequential(bottom(seed=0), top(seed=1))


def shard_batch(shards: int, seed: int = 0) -> Callable[[int, int], Batch]:
    """batch(shard, step): BATCH samples of shard ``shard`` (the ids congruent to it modulo
    ``shards``), drawn by (seed, shard, step) alone."""
    x, y = dataset()

    def batch(shard: int, step: int) -> Batch:
        ids = np.arange(shard, SAMPLES, shards)
        take = np.random.default_rng([seed, shard, step]).choice(ids, BATCH, replace=False)
        return (x[take],), (y[take],)
    return batch


def build_replica(settings: Settings, index: int) -> ReplicaSpec:
    """The ReplicaSpec of replica ``index``: every replica builds the same model, and draws its
    batches from its own shard."""
    shards = load_job(settings).n
    return ReplicaSpec(model=whole(), loss=nn.functional.mse_loss, batch=shard_batch(shards, settings.job.seed))
