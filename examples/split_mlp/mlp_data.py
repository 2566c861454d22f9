"""The example's data, shared by the Paddle model (mlp.py) and the PyTorch one (mlp_torch.py):
a synthetic regression task, y = sin(x @ w) + noise (variance about 0.43).

Cluster S holds the features, cluster T the labels; they agree on micro-batch ``i``
through a seeded schedule, and the activation carries the sample ids so T can
find its labels.
"""

from __future__ import annotations

import numpy as np

SAMPLES, FEATURES, HIDDEN, BATCH = 512, 16, 32, 32


def dataset(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    w = rng.normal(size=(FEATURES, 1)) / np.sqrt(FEATURES)
    y = np.sin(x @ w) + 0.05 * rng.normal(size=(SAMPLES, 1))
    return x, y.astype(np.float32)


def baseline(y: np.ndarray) -> float:
    """The mean squared error of predicting the targets' mean, whatever the features: what a
    model that learnt nothing scores (about 0.43 here)."""
    return float(np.var(y))


def batch_ids(mb: int, seed: int = 0) -> np.ndarray:
    """Sample ids of micro-batch ``mb``: a fresh permutation per epoch, same on both sides."""
    epoch, k = divmod(mb, SAMPLES // BATCH)
    return np.random.default_rng([seed, epoch]).permutation(SAMPLES)[k * BATCH:(k + 1) * BATCH].astype(np.int64)
