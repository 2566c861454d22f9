"""The example's MLP in PyTorch (mlp.py is the Paddle one): the same data and layer sizes,
with dropout, so either side of the split can be either framework.

    nebula-mq run examples/split_mlp/job-torch.toml     # both halves in PyTorch
    nebula-mq run examples/split_mlp/job-mixed.toml     # a Paddle head, a PyTorch tail
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mlp_data import FEATURES, HIDDEN, baseline, batch_ids, dataset


def bottom(seed: int = 0, dropout: float = 0.1) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Dropout(dropout), nn.Linear(HIDDEN, HIDDEN),
                         nn.ReLU())


def top(seed: int = 1, dropout: float = 0.1) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Dropout(dropout), nn.Linear(HIDDEN, 1))


def batch(mb: int) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of micro-batch ``mb`` (for a joint reference run)."""
    x, y = dataset()
    ids = batch_ids(mb)
    return x[ids], y[ids]


# ---- builders named in the job files, for `nebula-mq run` ----------------------------------

def build_head(settings: object, dropout: float = 0.1) -> object:
    from workers.split import HeadSpec

    x, _ = dataset()  # S uses only the features
    return HeadSpec(model=bottom(dropout=dropout), inputs=lambda mb: (ids := batch_ids(mb), x[ids]))


def build_tail(settings: object, dropout: float = 0.1) -> object:
    from workers.split import TailSpec

    _, y = dataset()  # T uses only the labels
    return TailSpec(model=top(dropout=dropout), loss=nn.functional.mse_loss, targets=lambda ids: y[ids],
                    baseline=baseline(y))
