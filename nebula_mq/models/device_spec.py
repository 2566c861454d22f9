"""A device spec (``cpu``, ``gpu``, ``gpu:N``, ``auto``) read the same way by every framework;
importing this module imports none."""

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
