"""A small Paddle MLP cut in two, on the example's regression task (mlp_data.py).

Cluster S holds the features and the bottom layers, cluster T the labels and the
top layers. mlp_torch.py is the same model in PyTorch; either side can be either.
"""

from __future__ import annotations

import paddle
from paddle import nn

from mlp_data import BATCH, FEATURES, HIDDEN, SAMPLES, baseline, batch_ids, dataset

__all__ = ["BATCH", "SAMPLES", "batch_ids", "bottom", "build_head", "build_tail", "dataset", "top"]


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
    return TailSpec(model=top(), loss=nn.functional.mse_loss, targets=lambda ids: y[ids], baseline=baseline(y))
