"""A small MLP cut in two, on a synthetic regression task (y = sin(x @ w) + noise, var ~0.43).

Cluster S holds the features and the bottom layers, cluster T the labels and the
top layers; they agree on micro-batch ``i`` through a seeded schedule, and the
activation carries the sample ids so T can find its labels.
"""

from __future__ import annotations

import numpy as np
import paddle
from paddle import nn

SAMPLES, FEATURES, HIDDEN, BATCH = 512, 16, 32, 32


def dataset(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    w = rng.normal(size=(FEATURES, 1)) / np.sqrt(FEATURES)
    y = np.sin(x @ w) + 0.05 * rng.normal(size=(SAMPLES, 1))
    return x, y.astype(np.float32)


def batch_ids(mb: int, seed: int = 0) -> np.ndarray:
    """Sample ids of micro-batch ``mb``: a fresh permutation per epoch, same on both sides."""
    epoch, k = divmod(mb, SAMPLES // BATCH)
    return np.random.default_rng([seed, epoch]).permutation(SAMPLES)[k * BATCH:(k + 1) * BATCH].astype(np.int64)


def bottom(seed: int = 0) -> nn.Layer:
    paddle.seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU())


def top(seed: int = 1) -> nn.Layer:
    paddle.seed(seed)
    return nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))


# ---- builders named in job.toml, for `nebula-mq run job.toml` ------------------------------

def build_head(settings: object) -> object:
    from workers.split import HeadSpec

    x, _ = dataset()  # S uses only the features
    return HeadSpec(model=bottom(), inputs=lambda mb: (ids := batch_ids(mb), x[ids]))


def build_tail(settings: object) -> object:
    from workers.split import TailSpec

    _, y = dataset()  # T uses only the labels
    return TailSpec(model=top(), loss=nn.functional.mse_loss, targets=lambda ids: y[ids])
