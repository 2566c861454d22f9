"""Paddle model and optimizer state <-> plain numpy arrays for checkpoints.

Paddle names parameters from a process-global counter (``linear_3.w_0``), so
those names depend on what else the process built. Checkpoints use the
structured names of ``named_parameters()`` instead, and optimizer
accumulators (``<param.name>_moment1_0``) are re-keyed onto them, so a state
saved by one process loads into another that built the same model.

Frozen (pretrained) parameters are not saved: they are reloaded from the
weight files, identically, at start.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import paddle
from paddle import nn

from nebula_mq.errors import CheckpointError


def _trainable(layer: nn.Layer) -> dict[str, paddle.Tensor]:
    return {name: p for name, p in layer.named_parameters() if not p.stop_gradient}


def state_arrays(prefix: str, layer: nn.Layer, optimizer: paddle.optimizer.Optimizer) -> dict[str, np.ndarray]:
    params = _trainable(layer)
    out = {f"{prefix}/param/{name}": p.numpy() for name, p in params.items()}
    by_internal = {p.name: name for name, p in params.items()}
    for key, value in optimizer.state_dict().items():
        if not isinstance(value, paddle.Tensor):
            continue  # LR scheduler state: derived from the step, not saved
        owner = next((internal for internal in by_internal if key.startswith(internal + "_")), None)
        if owner is None:
            continue
        suffix = key[len(owner) + 1 :]
        out[f"{prefix}/opt/{by_internal[owner]}/{suffix}"] = value.numpy()
    return out


def load_params(prefix: str, layer: nn.Layer, arrays: Mapping[str, np.ndarray]) -> dict[str, paddle.Tensor]:
    """Set ``layer``'s trainable parameters from a checkpoint; returns them by structured name."""
    params = _trainable(layer)
    for name, p in params.items():
        key = f"{prefix}/param/{name}"
        if key not in arrays:
            raise CheckpointError(f"checkpoint lacks {key}")
        value = arrays[key]
        if tuple(value.shape) != tuple(p.shape):
            raise CheckpointError(f"{key}: shape {value.shape} != model {tuple(p.shape)}")
        p.set_value(value)
    return params


def load_state_arrays(prefix: str, layer: nn.Layer, optimizer: paddle.optimizer.Optimizer,
                      arrays: Mapping[str, np.ndarray]) -> None:
    params = load_params(prefix, layer, arrays)
    opt_state: dict[str, paddle.Tensor] = {}
    for name, p in params.items():
        opt_prefix = f"{prefix}/opt/{name}/"
        for akey, avalue in arrays.items():
            if akey.startswith(opt_prefix):
                opt_state[f"{p.name}_{akey[len(opt_prefix):]}"] = paddle.to_tensor(avalue)
    if opt_state:
        optimizer.set_state_dict(opt_state)
