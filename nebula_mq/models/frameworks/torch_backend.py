"""The PyTorch side of :mod:`nebula_mq.models.frameworks`.

Exactly-once replay asks that a resumed side recompute what a clean run computed,
bit for bit: deterministic algorithms are switched on (CPU kernels are; on CUDA
cuBLAS needs its fixed workspace, set before the first product), dropout is
seeded per micro-batch, and the optimizer's state (Adam's step count included)
is saved and restored as exact arrays.

The group is ``torch.distributed``: gloo on the CPU, NCCL on GPUs, its store on
the side's master port, every collective under :func:`nebula_mq.models.collectives.deadline`
as paddle's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from nebula_mq.errors import WorkerError
from nebula_mq.models.collectives import JoinedGroup, deadline, warn_ephemeral_ports
from nebula_mq.models.device import pick_device
from nebula_mq.models.frameworks import Framework, checked_weights
from nebula_mq.models.group_address import GroupAddress


def resolve_device(spec: str, local_rank: int, where: str, source: str = "<settings>") -> str:
    """The torch device for ``spec`` on rank ``local_rank`` of this host."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = pick_device(spec, gpus, local_rank, where, "torch", source)
    return "cpu" if index is None else f"cuda:{index}"


class TorchGroup(JoinedGroup):
    """A joined ``torch.distributed`` process group (one per process)."""

    def allreduce_gradients(self, params: Sequence[Any], op: str = "mean",
                            extra: Sequence[float] = ()) -> np.ndarray:
        params = list(params)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        device = params[0].device if params else torch.device("cpu")
        flat = torch.cat([g.reshape(-1).float() for g in grads]
                         + [torch.as_tensor(np.asarray(extra, np.float32), device=device)])
        self._run("gradient all-reduce", dist.all_reduce, flat)
        riders = flat[flat.numel() - len(extra):].cpu().numpy() if extra else np.zeros(0, np.float32)
        if op == "mean":
            flat = flat / float(self.world_size)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset:offset + n].reshape(p.shape).to(p.dtype).clone()
            offset += n
        return np.asarray(riders)

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        self._run("checkpoint agreement", dist.all_reduce, t, op=dist.ReduceOp.MIN)
        return int(t.cpu()[0])

    def barrier(self) -> None:
        self._run("barrier", dist.barrier)


def fp16_narrowed(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` (float32) as the fp16 codec casts it, on its own device, copied to the host:
    finite values clamped to +-65504 (NaN and Inf left for the codec to refuse), rounded to
    nearest even as numpy's cast rounds."""
    fp16_max = float(np.finfo(np.float16).max)
    with torch.no_grad():
        t = tensor.detach()
        clamped = torch.where(torch.isfinite(t), t.clamp(-fp16_max, fp16_max), t)
        return np.asarray(clamped.to(torch.float16).cpu().numpy())


def owned_float32(array: np.ndarray) -> np.ndarray:
    """``array`` as a float32 array that torch may share and write: itself when it is one already,
    else a copy. A decoded message's arrays are read-only views of its bytes: torch warns about
    sharing those, and an in-place op on a gradient it holds (clipping) would write into them."""
    return np.require(array, np.float32, ["C", "W"])


class TorchFramework(Framework):
    """:class:`~nebula_mq.models.frameworks.Framework` for ``torch.nn.Module`` models."""

    name = "torch"
    tensor_type = torch.Tensor
    random_lock = threading.RLock()
    manual_seed = torch.manual_seed  # every device's generator

    def __init__(self) -> None:
        self.device = torch.device("cpu")

    @staticmethod
    def trains(param: Any) -> bool:
        return bool(param.requires_grad)

    def place(self, spec: str, local_rank: int, where: str, source: str = "<settings>") -> str:
        device = resolve_device(spec, local_rank, where, source)
        if device.startswith("cuda"):
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
            torch.cuda.set_device(device)
        torch.use_deterministic_algorithms(True)
        self.device = torch.device(device)
        return device

    def to_device(self, model: Any) -> Any:
        return model.to(self.device)

    def no_grad(self) -> AbstractContextManager[object]:
        return torch.no_grad()

    def tensor(self, array: np.ndarray, grad: bool = False) -> Any:
        t = torch.from_numpy(np.array(array, copy=True, order="C")).to(self.device)
        return t.requires_grad_(True) if grad else t

    def numpy(self, tensor: Any) -> np.ndarray:
        return np.asarray(tensor.detach().cpu().numpy())

    def narrow_fp16(self, tensor: Any) -> np.ndarray | None:
        if tensor.dtype != torch.float32 or tensor.device.type != "cuda":
            return None  # on the CPU numpy's chunked cast is as fast, and the bytes stay put
        return fp16_narrowed(tensor)

    def backward(self, output: Any, grad: np.ndarray) -> None:
        output.backward(torch.from_numpy(owned_float32(grad)).to(output.device, output.dtype))

    def set_param_grads(self, model: Any, grads: Mapping[str, np.ndarray]) -> None:
        for name, p in self.named_trainable(model).items():
            grad = owned_float32(grads[name]).reshape(tuple(p.shape))
            p.grad = torch.from_numpy(grad).to(p.device, p.dtype)

    def default_optimizer(self, params: list[Any], lr: float) -> Any:
        return torch.optim.Adam(params, lr=lr)

    def step(self, optimizer: Any, lr: float | None) -> None:
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def state_arrays(self, prefix: str, model: Any, optimizer: Any) -> dict[str, np.ndarray]:
        named = self.named_trainable(model)
        out = {f"{prefix}/param/{name}": self.numpy(p) for name, p in named.items()}
        for name, p in named.items():
            for slot, value in optimizer.state.get(p, {}).items():
                array = self.numpy(value) if isinstance(value, torch.Tensor) else np.asarray(value)
                out[f"{prefix}/opt/{name}/{slot}"] = array
        return out

    def load_weights(self, prefix: str, model: Any, arrays: Mapping[str, np.ndarray]) -> None:
        with torch.no_grad():
            for p, value in checked_weights(prefix, self.named_trainable(model), arrays):
                p.copy_(torch.from_numpy(np.array(value)))

    def load_state_arrays(self, prefix: str, model: Any, optimizer: Any,
                          arrays: Mapping[str, np.ndarray]) -> None:
        self.load_weights(prefix, model, arrays)
        for name, p in model.named_parameters():
            slots = {k[len(f"{prefix}/opt/{name}/"):]: v for k, v in arrays.items()
                     if k.startswith(f"{prefix}/opt/{name}/")}
            if p.requires_grad and slots:
                # Adam keeps its step count on the host, its moments beside the parameter.
                optimizer.state[p] = {slot: torch.from_numpy(np.array(v)).to("cpu" if slot == "step" else p.device)
                                      for slot, v in slots.items()}

    def save_model(self, model: Any, stem: Path) -> Path:
        path = stem.with_suffix(".pt")
        torch.save(model.state_dict(), path)
        return path

    def join_group(self, rank: int, address: GroupAddress, timeout_s: float) -> TorchGroup:
        world = address.world
        if world < 1 or not 0 <= rank < world:
            raise WorkerError(f"rank {rank} outside a group of {world}")
        warn_ephemeral_ports([address.master])
        os.environ.update(address.bind_env(rank))
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        try:
            with deadline("group rendezvous", rank, timeout_s):
                dist.init_process_group(backend, init_method=f"tcp://{address.master}", rank=rank,
                                        world_size=world, timeout=timedelta(seconds=timeout_s))
        except (RuntimeError, OSError, ValueError) as exc:
            raise WorkerError(f"cannot join the {backend} group as rank {rank}/{world} via "
                              f"{address.master}: {str(exc).strip().splitlines()[0]}") from None
        return TorchGroup(rank, world, timeout_s)
