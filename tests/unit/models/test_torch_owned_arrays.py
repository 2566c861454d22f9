"""The PyTorch backend takes a decoded message's arrays, read-only views of its bytes, without
sharing them: no "not writable" warning in a worker's log, and an in-place op on a gradient
(clipping) never writes into the message."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from nebula_mq.models.frameworks.torch_backend import TorchFramework, owned_float32  # noqa: E402


def read_only(values: list[float]) -> np.ndarray:
    return np.frombuffer(np.asarray(values, np.float32).tobytes(), np.float32)  # as a decoded message's


def test_a_read_only_gradient_flows_back_without_a_warning() -> None:
    fw, grad = TorchFramework(), read_only([1.0, 2.0])
    x = torch.ones(2, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "not writable" UserWarning would fail here
        fw.backward(x * 3.0, grad)
    assert x.grad is not None and x.grad.tolist() == [3.0, 6.0]


def test_gradients_set_from_a_message_are_the_models_own_to_clip() -> None:
    fw, model = TorchFramework(), torch.nn.Linear(2, 1, bias=False)
    message = read_only([3.0, 4.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fw.set_param_grads(model, {"weight": message})
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # scales the gradient in place
    assert model.weight.grad is not None
    assert model.weight.grad.flatten().tolist() == pytest.approx([0.6, 0.8], abs=1e-6)
    assert message.tolist() == [3.0, 4.0] and not message.flags.writeable


def test_a_writable_float32_array_is_taken_as_it_is() -> None:
    mine = np.arange(4, dtype=np.float32)
    assert owned_float32(mine) is mine
    assert owned_float32(read_only([1.0])).flags.writeable
