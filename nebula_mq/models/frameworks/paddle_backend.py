"""The Paddle side of :mod:`nebula_mq.models.frameworks`: paddle's own device, state and group code."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from nebula_mq.errors import ModelError
from nebula_mq.models.cpu import apply_deferred_paddle_threads
from nebula_mq.models.data_parallel import DataParallelGroup, init_group
from nebula_mq.models.device import use_device
from nebula_mq.models.group_address import GroupAddress
from nebula_mq.models.state import load_params, load_state_arrays, state_arrays

# Held while a side draws from the framework's process-global generator (seeded()).
_RANDOM = threading.RLock()

class PaddleFramework:
    """:class:`~nebula_mq.models.frameworks.Framework` for ``paddle.nn.Layer`` models."""

    name = "paddle"

    def __init__(self) -> None:
        # A split or replicas worker learns its model's framework only here (configure_cpu left
        # paddle's threads unset in case it was torch): the share it chose, now.
        apply_deferred_paddle_threads()

    def place(self, spec: str, local_rank: int, where: str, source: str = "<settings>") -> str:
        return use_device(spec, local_rank, where, source)

    def to_device(self, model: Any) -> Any:
        return model  # paddle builds on the device set by place(); a built layer stays where it is

    @contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        with _RANDOM:
            paddle.seed(seed)
            yield

    def no_grad(self) -> AbstractContextManager[object]:
        return paddle.no_grad()

    def tensor(self, array: np.ndarray, grad: bool = False) -> Any:
        return paddle.to_tensor(np.asarray(array), stop_gradient=not grad)

    def numpy(self, tensor: Any) -> np.ndarray:
        return np.asarray(tensor.numpy())

    def narrow_fp16(self, tensor: Any) -> np.ndarray | None:
        return None  # paddle runs on CPUs here: the codec casts on the host

    def is_float_tensor(self, value: object) -> bool:
        return isinstance(value, paddle.Tensor) and value.is_floating_point()

    def backward(self, output: Any, grad: np.ndarray) -> None:
        output.backward(paddle.to_tensor(np.asarray(grad, dtype=np.float32)))

    def loss_backward(self, loss: object, where: str) -> float:
        if not isinstance(loss, paddle.Tensor) or loss.size != 1:
            shape = list(loss.shape) if isinstance(loss, paddle.Tensor) else type(loss).__name__
            raise ModelError(f"{where}: the loss must be a scalar paddle tensor, got {shape}")
        loss.backward()
        return float(loss)

    def grad(self, tensor: Any, where: str) -> np.ndarray:
        if tensor.grad is None:  # made with grad=True: the model cut it from the loss
            raise ModelError(f"{where}: no gradient reached the model's input: the loss must depend on it "
                             "without a detach (or a numpy round trip) in between")
        return np.asarray(tensor.grad.numpy())

    def trainable(self, model: Any) -> list[Any]:
        return [p for p in model.parameters() if not p.stop_gradient]

    def param_grads(self, model: Any) -> dict[str, np.ndarray]:
        return {name: np.zeros(p.shape, np.float32) if p.grad is None else np.array(p.grad.numpy(), np.float32)
                for name, p in model.named_parameters() if not p.stop_gradient}

    def set_param_grads(self, model: Any, grads: Mapping[str, np.ndarray]) -> None:
        params = {name: p for name, p in model.named_parameters() if not p.stop_gradient}
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
        return state_arrays(prefix, model, optimizer)

    def load_state_arrays(self, prefix: str, model: Any, optimizer: Any,
                          arrays: Mapping[str, np.ndarray]) -> None:
        load_state_arrays(prefix, model, optimizer, arrays)

    def load_weights(self, prefix: str, model: Any, arrays: Mapping[str, np.ndarray]) -> None:
        load_params(prefix, model, arrays)

    def save_model(self, model: Any, stem: Path) -> Path:
        path = stem.with_suffix(".pdparams")
        paddle.save(model.state_dict(), str(path))
        return path

    def join_group(self, rank: int, address: GroupAddress, timeout_s: float) -> DataParallelGroup:
        os.environ.update(address.bind_env(rank))
        return init_group(rank, address.world, address.endpoints, master=address.master, timeout_s=timeout_s)
