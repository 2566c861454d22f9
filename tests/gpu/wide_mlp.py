"""The model the GPU check trains: the example's split MLP (examples/split_mlp/mlp_torch.py)
widened until the GPU matters, with dropout on both sides (seeded per micro-batch, so it
still replays bit for bit).

The data is the example's kind of task, y = sin(x @ w) + noise, with more features and
samples: cluster S (the head) holds the features, cluster T (the tail) the labels, and
both derive micro-batch ``mb``'s sample ids from a seeded schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Size:
    """The model and data sizes (the default is the GPU size)."""

    features: int = 256
    hidden: int = 2048
    batch: int = 512
    samples: int = 16384

    def lr(self) -> float:
        """Adam's rate: 1e-3 up to hidden 256, then inversely to the width (at hidden 1024,
        1e-3 made the loss spike to 1.3 and stay noisy with two micro-batches in flight)."""
        return 1e-3 * min(1.0, 256 / self.hidden)

    def head_params(self) -> int:
        f, h = self.features, self.hidden
        return (f * h + h) + 2 * (h * h + h)

    def tail_params(self) -> int:
        h = self.hidden
        return 2 * (h * h + h) + (h + 1)

    def describe(self) -> str:
        millions = (self.head_params() + self.tail_params()) / 1e6
        return (f"MLP {self.features}->{self.hidden}x3 | {self.hidden}x2->1, "
                f"{millions:.1f} M params, batch {self.batch}")


@lru_cache(maxsize=4)
def dataset(size: Size, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features [samples, features] and labels [samples, 1], float32."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size.samples, size.features)).astype(np.float32)
    w = rng.normal(size=(size.features, 1)) / np.sqrt(size.features)
    y = np.sin(x @ w) + 0.05 * rng.normal(size=(size.samples, 1))
    return x, y.astype(np.float32)


def batch_ids(size: Size, mb: int, seed: int = 0) -> np.ndarray:
    """Sample ids of micro-batch ``mb``: a fresh permutation per epoch, the same on both sides."""
    per_epoch = size.samples // size.batch
    epoch, k = divmod(mb, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(size.samples)
    return order[k * size.batch:(k + 1) * size.batch].astype(np.int64)


def bottom(size: Size, seed: int = 0, dropout: float = 0.1) -> nn.Module:
    """The head half (cluster S): three wide layers."""
    torch.manual_seed(seed)
    h = size.hidden
    return nn.Sequential(nn.Linear(size.features, h), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(h, h), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(h, h), nn.ReLU())


def top(size: Size, seed: int = 1, dropout: float = 0.1) -> nn.Module:
    """The tail half (cluster T): two wide layers and the regression output."""
    torch.manual_seed(seed)
    h = size.hidden
    return nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))


def head_spec(size: Size) -> Any:
    """A fresh head (a restarted worker builds its model anew, then loads its checkpoint)."""
    from workers.split import HeadSpec

    x, _ = dataset(size)
    return HeadSpec(model=bottom(size), inputs=lambda mb: (ids := batch_ids(size, mb), x[ids]))


def tail_spec(size: Size) -> Any:
    from workers.split import TailSpec

    _, y = dataset(size)
    return TailSpec(model=top(size), loss=nn.functional.mse_loss, targets=lambda ids: y[ids])
