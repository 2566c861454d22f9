"""The language-identification example's transformer (langid_model.py: the byte head and the
classifying tail, in PyTorch) as one whole model, for a replicas job: every cluster trains a
full replica on its own shard of the real gettext strings (langid_data.py) and the clusters
meet every ``inner_steps`` in a (streaming) DiLoCo outer step.

    nebula-mq run examples/split_langid/replicas.toml     # the default two-node stack
    python examples/split_langid/evaluate.py examples/split_langid/replicas.toml

The second command scores the held-out strings with the outer weights of replica-0's last
checkpoint (equal on every replica after the last round).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch import nn

import langid_data
from langid_data import BATCH, LangData
from langid_model import head_model, tail_model
from nebula_mq.settings import Settings
from workers.replicas.job import ReplicaSpec, load_job

Batch = tuple[tuple[np.ndarray], tuple[np.ndarray]]


def whole(languages: int, dropout: float = 0.1) -> nn.Sequential:
    """Head then tail as one model. The halves' own seeds (0 and 1, as the split job uses)
    make every cluster build bit-identical initial weights; the replica then seeds dropout per
    inner step, so a resumed or remote replica draws the same masks."""
    return nn.Sequential(head_model(seed=0, dropout=dropout), tail_model(languages, seed=1, dropout=dropout))


def shard_batch(data: LangData, shards: int, seed: int = 0, batch: int = BATCH) -> Callable[[int, int], Batch]:
    """batch(shard, step): ``batch`` training strings of shard ``shard`` (the ids congruent to
    it modulo ``shards``, so the shards are disjoint), drawn by (seed, shard, step) alone: a
    replica that resumes at step t draws what it drew the first time."""
    x, y = data.train_bytes, data.train_labels
    # Each shard holds every language in equal measure: the training split is grouped by
    # label, so taking every ``shards``-th id keeps each language's share.
    ids = [np.arange(shard, len(y), shards) for shard in range(shards)]

    def draw(shard: int, step: int) -> Batch:
        take = np.random.default_rng([seed, shard, step]).choice(ids[shard], batch, replace=False)
        return (x[take],), (y[take],)
    return draw


def build_replica(settings: Settings, index: int, data: LangData | None = None) -> ReplicaSpec:
    """The ReplicaSpec of replica ``index``: the same model on every cluster, the
    cross-entropy of its logits against the strings' languages, batches from its own shard.
    ``data`` defaults to this machine's catalogues, read once per process (lru_cache)."""
    data = data or langid_data.dataset()  # looked up at call time: the tests swap in tiny strings
    return ReplicaSpec(model=whole(len(data.languages)), loss=nn.functional.cross_entropy,
                       batch=shard_batch(data, load_job(settings).n, settings.job.seed))
