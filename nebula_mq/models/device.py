"""Which device a worker computes on: ``[job] device``, or a role's override of it.

``cpu``; ``gpu`` (this rank's GPU: local rank modulo the GPUs present); ``gpu:N``;
``auto`` (a GPU when paddle sees one, else the CPU). Models, optimizers and the
collectives follow the device paddle is set to here (``data_parallel`` picks NCCL
on a GPU, gloo on the CPU); nothing else in the code names a device.
"""

from __future__ import annotations

import paddle

from nebula_mq.models.device_spec import pick_device


def visible_gpus() -> int:
    if not paddle.is_compiled_with_cuda():
        return 0
    return int(paddle.device.cuda.device_count())


def resolve_device(spec: str, local_rank: int = 0, where: str = "job.device", source: str = "<settings>") -> str:
    """The paddle device string for ``spec`` on rank ``local_rank`` of this host."""
    index = pick_device(spec, visible_gpus(), local_rank, where, "paddle", source)
    return "cpu" if index is None else f"gpu:{index}"


def use_device(spec: str, local_rank: int = 0, where: str = "job.device", source: str = "<settings>") -> str:
    """Set paddle's device for this process (before any model is built); returns it."""
    device = resolve_device(spec, local_rank, where, source)
    paddle.set_device(device)
    return device
