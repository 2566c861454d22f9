"""Which device a worker computes on: ``[job] device``, or a role's override of it.

``cpu``; ``gpu`` (this rank's GPU: local rank modulo the GPUs present); ``gpu:N``;
``auto`` (a GPU when the framework sees one, else the CPU). :func:`pick_device` reads a spec
the same way for every framework and imports none; the rest is paddle's. Models, optimizers
and the collectives follow the device paddle is set to here (``data_parallel`` picks NCCL
on a GPU, gloo on the CPU); nothing else in the code names a device.
"""

from __future__ import annotations

from nebula_mq.errors import ConfigError
from nebula_mq.settings import DEVICE_PATTERN


def pick_device(spec: str, gpus: int, local_rank: int, where: str, framework: str,
                source: str = "<settings>") -> int | None:
    """The GPU index ``spec`` (cpu, gpu, gpu:N, auto) names on a host where ``framework`` sees
    ``gpus`` GPUs, for rank ``local_rank`` of this host; None for the CPU. A device the host
    lacks is a one-line ``ConfigError`` naming the job file (``source``) and the key (``where``)."""
    if not DEVICE_PATTERN.match(spec):
        raise ConfigError(source, where, "cpu, gpu, gpu:N or auto", spec)
    if spec == "cpu" or (spec == "auto" and gpus == 0):
        return None
    if gpus == 0:
        raise ConfigError(source, where, f"a device this machine has ({framework} sees no GPU)", spec)
    if spec in ("gpu", "auto"):
        return local_rank % gpus
    index = int(spec.split(":", 1)[1])
    if index >= gpus:
        raise ConfigError(source, where, f"a GPU index below {gpus}", spec)
    return index


def visible_gpus() -> int:
    import paddle

    if not paddle.is_compiled_with_cuda():
        return 0
    return int(paddle.device.cuda.device_count())


def resolve_device(spec: str, local_rank: int = 0, where: str = "job.device", source: str = "<settings>") -> str:
    """The paddle device string for ``spec`` on rank ``local_rank`` of this host."""
    index = pick_device(spec, visible_gpus(), local_rank, where, "paddle", source)
    return "cpu" if index is None else f"gpu:{index}"


def use_device(spec: str, local_rank: int = 0, where: str = "job.device", source: str = "<settings>") -> str:
    """Set paddle's device for this process (before any model is built); returns it."""
    import paddle

    device = resolve_device(spec, local_rank, where, source)
    paddle.set_device(device)
    return device
