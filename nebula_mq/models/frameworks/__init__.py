"""One side's deep-learning framework behind one small interface: Paddle or PyTorch.

Only numpy arrays cross between the two sides of a split model (activations one
way, gradients the other), so the framework is each side's own choice: a head in
Paddle can train with a tail in PyTorch. Everything framework-specific that a
split side does goes through a :class:`Framework`: placing the model on a device,
tensors from numpy and back, forward under a seed, backward from an incoming
gradient or from a scalar loss, the optimizer's step, the trainable weights and
optimizer state as named numpy arrays (checkpoints), and the side's data-parallel
group (gloo on CPUs, NCCL on GPUs).

:func:`framework_of` picks the implementation from the model itself; importing
this package imports neither framework.
"""

from __future__ import annotations

import abc
import math
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from nebula_mq.errors import CheckpointError, ConfigError, ModelError, NebulaError, one_line
from nebula_mq.models.group_address import GroupAddress
from nebula_mq.runtime.agreement import Collective
from nebula_mq.runtime.logs import get_logger

FRAMEWORKS = ("paddle", "torch")

log = get_logger(__name__)


@contextmanager
def user_code(what: str) -> Iterator[None]:
    """A call into the user's own model, loss or data function (``what``: ``tail-0: the
    model's forward on micro-batch 12``). Whatever it raises becomes one :class:`ModelError`
    that says so, with the framework's own first line; the whole trace goes to the log. Our
    own typed errors pass unchanged."""
    try:
        yield
    except NebulaError:
        raise
    except Exception as exc:
        log.error("user_code_raised", what=what, exc_info=True)
        raise ModelError(f"{what} raised {one_line(exc)}") from None


class Group(Collective, Protocol):
    """A side's data-parallel group: the agreement's collectives (``runtime.agreement``) and the
    gradients' all-reduce; every collective either completes or ends the process within the
    group's timeout (``models.collectives``)."""

    rank: int
    world_size: int

    def allreduce_gradients(self, params: Sequence[Any], op: str = "mean",
                            extra: Sequence[float] = ()) -> np.ndarray:
        """Sum (or mean) every parameter's gradient over the group; ``extra`` values are summed
        in the same collective and returned."""


class Framework(abc.ABC):
    """What a split side needs of its framework; tensors are the framework's own. Each adapter
    gives its framework's tensor type, seed and trainable flag, and what differs (devices,
    optimizers, state, groups); what both do alike is here."""

    name: ClassVar[str]
    tensor_type: ClassVar[type]
    # Held while a side draws from the framework's process-global generator (seeded()).
    random_lock: ClassVar[threading.RLock]
    manual_seed: ClassVar[Callable[[int], object]]

    @staticmethod
    @abc.abstractmethod
    def trains(param: Any) -> bool:
        """Whether the optimizer updates ``param``."""

    @abc.abstractmethod
    def place(self, spec: str, local_rank: int, where: str, source: str = "<settings>") -> str:
        """Resolve ``spec`` (cpu, gpu, gpu:N, auto) to a device of this host and compute on it;
        a device the host lacks is a one-line ``ConfigError`` naming the job file (``source``)
        and the key (``where``)."""

    @abc.abstractmethod
    def to_device(self, model: Any) -> Any:
        """``model`` on the placed device (before its optimizer is built)."""

    @contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """A block whose random draws (dropout) follow ``seed``. The framework's generator is
        global to the process, so the block holds a process-wide lock: two sides in one process
        (threads, a notebook) still draw what they would draw alone."""
        with self.random_lock:
            type(self).manual_seed(seed)
            yield

    @abc.abstractmethod
    def no_grad(self) -> AbstractContextManager[object]:
        """A block that records no graph."""

    @abc.abstractmethod
    def tensor(self, array: np.ndarray, grad: bool = False) -> Any:
        """``array`` as a tensor on the device, its dtype kept; ``grad``: its gradient is wanted."""

    @abc.abstractmethod
    def numpy(self, tensor: Any) -> np.ndarray:
        """A tensor's values as a host array."""

    @abc.abstractmethod
    def narrow_fp16(self, tensor: Any) -> np.ndarray | None:
        """A float32 tensor as the fp16 codec casts it (finite values clamped to +-65504,
        rounded to nearest even), narrowed on its device before it is copied to the host;
        None where this framework or tensor does not (the codec then casts on the host)."""

    def is_float_tensor(self, value: object) -> bool:
        """Whether ``value`` is one of this framework's floating-point tensors."""
        tensor: Any = value
        return isinstance(value, self.tensor_type) and bool(tensor.is_floating_point())

    @abc.abstractmethod
    def backward(self, output: Any, grad: np.ndarray) -> None:
        """Back-propagate ``grad`` (d loss / d output) through the graph that made ``output``."""

    def loss_backward(self, loss: object, where: str) -> float:
        """Back-propagate a scalar loss; its value. A loss that is not a scalar tensor of this
        framework is a :class:`ModelError` naming ``where``."""
        tensor: Any = loss
        if not isinstance(loss, self.tensor_type) or math.prod(tensor.shape) != 1:
            shape = list(tensor.shape) if isinstance(loss, self.tensor_type) else type(loss).__name__
            raise ModelError(f"{where}: the loss must be a scalar {self.name} tensor, got {shape}")
        tensor.backward()
        return float(tensor)

    def grad(self, tensor: Any, where: str) -> np.ndarray:
        """The gradient accumulated on ``tensor`` (made with ``grad=True``); none there (the
        model detached it) is a :class:`ModelError` naming ``where``."""
        if tensor.grad is None:
            raise ModelError(f"{where}: no gradient reached the model's input: the loss must depend on it "
                             "without a detach (or a numpy round trip) in between")
        return self.numpy(tensor.grad)

    def named_trainable(self, model: Any) -> dict[str, Any]:
        """The parameters the optimizer updates, by structured name (``named_parameters()``)."""
        return {name: p for name, p in model.named_parameters() if self.trains(p)}

    def trainable(self, model: Any) -> list[Any]:
        """The parameters the optimizer updates."""
        return [p for p in model.parameters() if self.trains(p)]

    def param_grads(self, model: Any) -> dict[str, np.ndarray]:
        """The gradient on each trainable parameter, by structured name (zeros where the loss
        did not reach it), copied to the host."""
        return {name: np.zeros(tuple(p.shape), np.float32) if p.grad is None else self.numpy(p.grad).astype(np.float32)
                for name, p in self.named_trainable(model).items()}

    @abc.abstractmethod
    def set_param_grads(self, model: Any, grads: Mapping[str, np.ndarray]) -> None:
        """Make ``grads`` (by structured name, every trainable parameter) the gradients the
        next :meth:`step` applies, whatever backward left there before."""

    @abc.abstractmethod
    def default_optimizer(self, params: list[Any], lr: float) -> Any:
        """Adam at ``lr``: what a side trains with unless its spec gives an optimizer."""

    @abc.abstractmethod
    def step(self, optimizer: Any, lr: float | None) -> None:
        """One optimizer update (at ``lr`` when given), then clear the gradients."""

    @abc.abstractmethod
    def state_arrays(self, prefix: str, model: Any, optimizer: Any) -> dict[str, np.ndarray]:
        """Trainable weights and optimizer state under ``prefix/param/<name>`` and
        ``prefix/opt/<name>/<slot>``, by the parameters' structured names."""

    @abc.abstractmethod
    def load_state_arrays(self, prefix: str, model: Any, optimizer: Any,
                          arrays: Mapping[str, np.ndarray]) -> None:
        """Restore what :meth:`state_arrays` saved, bit for bit."""

    @abc.abstractmethod
    def load_weights(self, prefix: str, model: Any, arrays: Mapping[str, np.ndarray]) -> None:
        """Set the trainable weights from ``prefix/param/<name>`` arrays (no optimizer)."""

    @abc.abstractmethod
    def save_model(self, model: Any, stem: Path) -> Path:
        """The model's weights in the framework's own format (``stem`` plus its suffix: paddle's
        ``.pdparams``, torch's ``.pt``), loadable with ``paddle.load`` / ``torch.load``."""

    @abc.abstractmethod
    def join_group(self, rank: int, address: GroupAddress, timeout_s: float) -> Group:
        """Join the side's group at ``address`` as ``rank`` (``models.group_address``)."""


def checked_weights(prefix: str, params: Mapping[str, Any],
                    arrays: Mapping[str, np.ndarray]) -> Iterator[tuple[Any, np.ndarray]]:
    """Each parameter beside its ``prefix/param/<name>`` array; a missing array or another
    shape is a :class:`CheckpointError`."""
    for name, p in params.items():
        key = f"{prefix}/param/{name}"
        if key not in arrays:
            raise CheckpointError(f"checkpoint lacks {key}")
        if tuple(arrays[key].shape) != tuple(p.shape):
            raise CheckpointError(f"{key}: shape {arrays[key].shape} != model {tuple(p.shape)}")
        yield p, arrays[key]


def _owner(model: object) -> str | None:
    """Which framework ``model`` belongs to, judged without importing either framework: a
    model of a framework that was never imported cannot exist."""
    if "paddle" in sys.modules:
        import paddle

        if isinstance(model, paddle.nn.Layer):
            return "paddle"
    if "torch" in sys.modules:
        import torch

        if isinstance(model, torch.nn.Module):
            return "torch"
    return None


def framework_named(name: str, where: str = "framework", source: str = "<settings>") -> Framework:
    """The implementation of framework ``name`` (``paddle`` or ``torch``); ``where`` and
    ``source`` (the job file) name the key that chose it."""
    if name == "paddle":
        from nebula_mq.models.frameworks.paddle_backend import PaddleFramework

        return PaddleFramework()
    if name == "torch":
        try:
            from nebula_mq.models.frameworks.torch_backend import TorchFramework
        except ImportError:
            raise ConfigError(source, where, "torch installed (pip install 'nebula-mq[torch]')",
                              name) from None
        return TorchFramework()
    raise ConfigError(source, where, f"one of {list(FRAMEWORKS)}", name)


def framework_of(model: object, where: str, declared: str = "", source: str = "<settings>") -> Framework:
    """The framework of ``model`` (a ``paddle.nn.Layer`` or a ``torch.nn.Module``). ``declared``
    (``[split] head_framework``, ...) must agree with it when set. Anything else is a one-line
    ``ConfigError`` naming the job file (``source``), ``where`` and the model's type."""
    owner = _owner(model)
    if owner is None:
        raise ConfigError(source, where, "a paddle.nn.Layer or a torch.nn.Module",
                          f"{type(model).__module__}.{type(model).__qualname__}")
    if declared and declared != owner:
        raise ConfigError(source, f"{where}_framework", f"the model's framework ({owner})", declared)
    return framework_named(owner, where, source)
