"""The split API with PyTorch models (nebula_mq.models.frameworks) over the in-memory transport:
a torch pair trains and equals joint torch training, resumes bit for bit, trains beside a Paddle
half, and a user's mistake is a one-line error before anything is sent."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nebula_mq.errors import ConfigError, ModelError, NonFiniteTensor
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.settings import Settings
from nebula_mq.transport.memory import MemoryBroker

from tests.fixtures.pairs import SPLIT_EXAMPLE, assert_resume_matches_clean, memory_worker, split_pair
from tests.fixtures.pairs import split_settings as settings_for
from tests.fixtures.threads import history

pytestmark = pytest.mark.paddle  # the mixed pairs build a paddle half

torch = pytest.importorskip("torch")
sys.path.insert(0, str(SPLIT_EXAMPLE))  # the example's modules, as its job files import them
import mlp  # noqa: E402
import mlp_torch as torch_mlp  # noqa: E402


TORCH = split_pair(torch_mlp.build_head, torch_mlp.build_tail)
PADDLE_HEAD_TORCH_TAIL = split_pair(mlp.build_head, torch_mlp.build_tail)
TORCH_HEAD_PADDLE_TAIL = split_pair(torch_mlp.build_head, mlp.build_tail)


def test_a_torch_pair_trains_compressed_and_checkpoints_both_sides(tmp_path: Path) -> None:
    head, tail = TORCH(settings_for(tmp_path, steps=60), MemoryBroker())
    assert head.fw.name == tail.fw.name == "torch" and head.worker.step == tail.worker.step == 60
    curve = history(tmp_path, "tail-0", "loss")
    assert len(curve) == 60 and np.mean(curve[-10:]) < 0.5 * np.mean(curve[:10])
    ck = CheckpointStore(tmp_path / "checkpoints" / "head-0").latest()
    assert ck is not None and ck.step == 60
    assert {"head/param/0.weight", "head/opt/0.weight/exp_avg", "head/opt/0.weight/step"} <= set(ck.arrays)


def test_uncompressed_lockstep_torch_split_equals_joint_torch_training(tmp_path: Path) -> None:
    TORCH(settings_for(tmp_path, steps=12, in_flight=1, forward="none", backward="none"), MemoryBroker())
    split = history(tmp_path, "tail-0", "loss")

    from workers.split.job import micro_batch_seed

    bottom, top = torch_mlp.bottom(), torch_mlp.top()
    opt_b = torch.optim.Adam(bottom.parameters(), lr=0.003)
    opt_t = torch.optim.Adam(top.parameters(), lr=0.003)
    expected = []
    for mb in range(12):
        x, y = torch_mlp.batch(mb)
        torch.manual_seed(micro_batch_seed(7, "head", mb))
        act = bottom(torch.from_numpy(x))
        torch.manual_seed(micro_batch_seed(7, "tail", mb))
        loss = torch.nn.functional.mse_loss(top(act), torch.from_numpy(y))
        loss.backward()
        for opt in (opt_b, opt_t):
            opt.step()
            opt.zero_grad()
        expected.append(float(loss.detach()))
    np.testing.assert_allclose(split, expected, rtol=1e-5)
    assert expected[-1] < expected[0]


@pytest.mark.parametrize("run_pair", [TORCH, PADDLE_HEAD_TORCH_TAIL, TORCH_HEAD_PADDLE_TAIL],
                         ids=["torch", "paddle-head-torch-tail", "torch-head-paddle-tail"])
def test_stop_and_resume_is_bit_identical(tmp_path: Path, run_pair: Any) -> None:
    assert_resume_matches_clean(lambda d: settings_for(d, steps=12), run_pair, tmp_path, ("head-0", "tail-0"))


def test_a_paddle_head_trains_with_a_torch_tail(tmp_path: Path) -> None:
    head, tail = PADDLE_HEAD_TORCH_TAIL(settings_for(tmp_path, steps=60), MemoryBroker())
    assert (head.fw.name, tail.fw.name) == ("paddle", "torch")
    curve = history(tmp_path, "tail-0", "loss")
    assert np.mean(curve[-10:]) < 0.5 * np.mean(curve[:10])


# ---------------------------------------------------------------- a user's mistakes


def _head(tmp_path: Path, spec: Any, **split: Any) -> Any:
    from workers.split.head import SpecHead

    settings = settings_for(tmp_path, steps=4)
    if split:
        settings = Settings(job=settings.job, codec=settings.codec, transport=settings.transport,
                            split={**settings.section("split"), **split})
    return SpecHead(settings, spec, memory_worker(SpecHead.identity(settings), MemoryBroker()))


def test_a_model_of_neither_framework_is_a_config_error_naming_the_side(tmp_path: Path) -> None:
    from workers.split.job import HeadSpec

    with pytest.raises(ConfigError, match=r"split\.head.*paddle\.nn\.Layer or a torch\.nn\.Module.*builtins\.dict"):
        _head(tmp_path, HeadSpec(model={"not": "a model"}, inputs=lambda mb: ()))


def test_a_declared_framework_that_is_not_the_models_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"split\.head_framework.*torch.*paddle"):
        _head(tmp_path, torch_mlp.build_head(None), head_framework="paddle")
    with pytest.raises(ConfigError, match="head_framework"):
        _head(tmp_path, torch_mlp.build_head(None), head_framework="jax")


def test_a_gpu_on_a_host_without_one_is_a_config_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    with pytest.raises(ConfigError, match=r"split\.head_device.*torch sees no GPU.*gpu:3"):
        _head(tmp_path, torch_mlp.build_head(None), head_device="gpu:3")


class _IntHead(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(16, 32)

    def forward(self, x: Any) -> Any:
        return (self.w(x) > 0).long()


class _NaNHead(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(16, 32)

    def forward(self, x: Any) -> Any:
        return self.w(x) * float("nan")


@pytest.mark.parametrize("model,error,match", [
    (_IntHead(), ModelError, r"head-0: the head model must return one floating-point torch tensor, got torch\.int64"),
    (_NaNHead(), NonFiniteTensor, r"^head-0: the activation of micro-batch 0: .*NaN or Inf"),
])
def test_a_head_that_returns_no_float_or_a_nan_activation_fails_before_sending(
        tmp_path: Path, model: Any, error: type[Exception], match: str) -> None:
    from workers.split.job import HeadSpec

    x = np.ones((4, 16), np.float32)
    head = _head(tmp_path, HeadSpec(model=model, inputs=lambda mb: (np.arange(4), x)))
    head.worker.transport.declare_dead_letter_queue()
    head.open()
    with pytest.raises(error, match=match):
        head.send_activation(0)
    assert head.worker.transport.queue_depth(head.worker.transport.declare_flow(head.act_flows[0], "producer")) == 0


def _tail(tmp_path: Path, model: Any, loss: Any) -> Any:
    from workers.split.job import TailSpec
    from workers.split.tail import SpecTail

    settings = settings_for(tmp_path, steps=4)
    spec = TailSpec(model=model, loss=loss, targets=lambda ids: np.zeros((len(ids), 1), np.float32))
    return SpecTail(settings, spec, memory_worker(SpecTail.identity(settings), MemoryBroker()))


def test_a_tail_loss_that_is_not_a_scalar_is_a_model_error_naming_the_worker(tmp_path: Path) -> None:
    tail = _tail(tmp_path, torch_mlp.top(), lambda out, y: (out - y) ** 2)
    with pytest.raises(ModelError, match=r"tail-0: the loss must be a scalar torch tensor, got \[4, 1\]") as caught:
        tail.loss_and_grad(0, np.ones((4, 32), np.float32), {"sample_ids": np.arange(4)})
    assert not caught.value.restart_helps


class _DetachingTail(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(32, 1)

    def forward(self, x: Any) -> Any:
        return self.w(x.detach())


def test_a_tail_that_detaches_its_input_says_no_gradient_reached_it(tmp_path: Path) -> None:
    tail = _tail(tmp_path, _DetachingTail(), torch.nn.functional.mse_loss)
    with pytest.raises(ModelError, match=r"^tail-0: no gradient reached the model's input"):
        tail.loss_and_grad(0, np.ones((4, 32), np.float32), {"sample_ids": np.arange(4)})


def test_a_shape_mismatch_in_the_tail_is_one_line_naming_the_micro_batch_and_torchs_words(tmp_path: Path) -> None:
    tail = _tail(tmp_path, torch.nn.Linear(12, 1), torch.nn.functional.mse_loss)
    with pytest.raises(ModelError) as caught:
        tail.loss_and_grad(3, np.ones((4, 32), np.float32), {"sample_ids": np.arange(4)})
    assert str(caught.value) == ("tail-0: the model's forward on micro-batch 3 raised RuntimeError: "
                                 "mat1 and mat2 shapes cannot be multiplied (4x32 and 12x1)")
