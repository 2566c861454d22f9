"""The Paddle side of :mod:`nebula_mq.models.frameworks`: paddle's own device, state and group code.

Paddle names parameters from a process-global counter (``linear_3.w_0``), so
those names depend on what else the process built. Checkpoints use the
structured names of ``named_parameters()`` instead, and optimizer
accumulators (``<param.name>_moment1_0``) are re-keyed onto them, so a state
saved by one process loads into another that built the same model.

Frozen (pretrained) parameters are not saved: they are reloaded from the
weight files, identically, at start.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from nebula_mq.models.cpu import apply_deferred_paddle_threads
from nebula_mq.models.data_parallel import DataParallelGroup, init_group
from nebula_mq.models.device import use_device
from nebula_mq.models.frameworks import Framework, checked_weights
from nebula_mq.models.group_address import GroupAddress


class PaddleFramework(Framework):
    """:class:`~nebula_mq.models.frameworks.Framework` for ``paddle.nn.Layer`` models."""

    name = "paddle"
    tensor_type = paddle.Tensor
    random_lock = threading.RLock()
    manual_seed = paddle.seed

    def __init__(self) -> None:
        # A split or replicas worker learns its model's framework only here (configure_cpu left
        # paddle's threads unset in case it was torch): the share it chose, now.
        apply_deferred_paddle_threads()

    @staticmethod
    def trains(param: Any) -> bool:
        return not param.stop_gradient

    def place(self, spec: str, local_rank: int, where: str, source: str = "<settings>") -> str:
        return use_device(spec, local_rank, where, source)

    def to_device(self, model: Any) -> Any:
        return model  # paddle builds on the device set by place(); a built layer stays where it is

    def no_grad(self) -> AbstractContextManager[object]:
        return paddle.no_grad()

    def tensor(self, array: np.ndarray, grad: bool = False) -> Any:
        return paddle.to_tensor(np.asarray(array), stop_gradient=not grad)

    def numpy(self, tensor: Any) -> np.ndarray:
        return np.asarray(tensor.numpy())

    def narrow_fp16(self, tensor: Any) -> np.ndarray | None:
        return None  # paddle runs on CPUs here: the codec casts on the host

    def backward(self, output: Any, grad: np.ndarray) -> None:
        output.backward(paddle.to_tensor(np.asarray(grad, dtype=np.float32)))

    def set_param_grads(self, model: Any, grads: Mapping[str, np.ndarray]) -> None:
        params = self.named_trainable(model)
        if any(p.grad is None for p in params.values()):
            # Paddle makes a gradient only by backward (after a restore there is none yet): a
            # backward of zero times every parameter makes one of zeros on each.
            paddle.add_n([(p * 0.0).sum() for p in params.values()]).backward()
        for name, p in params.items():
            p.grad.set_value(np.asarray(grads[name], np.float32).reshape(p.shape))

    def default_optimizer(self, params: list[Any], lr: float) -> Any:
        return paddle.optimizer.Adam(learning_rate=lr, parameters=params)

    def step(self, optimizer: Any, lr: float | None) -> None:
        if lr is not None:
            optimizer.set_lr(lr)
        optimizer.step()
        optimizer.clear_grad()

    def state_arrays(self, prefix: str, model: Any, optimizer: Any) -> dict[str, np.ndarray]:
        params = self.named_trainable(model)
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

    def load_weights(self, prefix: str, model: Any, arrays: Mapping[str, np.ndarray]) -> None:
        for p, value in checked_weights(prefix, self.named_trainable(model), arrays):
            p.set_value(value)

    def load_state_arrays(self, prefix: str, model: Any, optimizer: Any,
                          arrays: Mapping[str, np.ndarray]) -> None:
        self.load_weights(prefix, model, arrays)
        opt_state: dict[str, paddle.Tensor] = {}
        for name, p in self.named_trainable(model).items():
            opt_prefix = f"{prefix}/opt/{name}/"
            for akey, avalue in arrays.items():
                if akey.startswith(opt_prefix):
                    opt_state[f"{p.name}_{akey[len(opt_prefix):]}"] = paddle.to_tensor(avalue)
        if opt_state:
            optimizer.set_state_dict(opt_state)

    def save_model(self, model: Any, stem: Path) -> Path:
        path = stem.with_suffix(".pdparams")
        paddle.save(model.state_dict(), str(path))
        return path

    def join_group(self, rank: int, address: GroupAddress, timeout_s: float) -> DataParallelGroup:
        os.environ.update(address.bind_env(rank))
        return init_group(rank, address.world, address.endpoints, master=address.master, timeout_s=timeout_s)
