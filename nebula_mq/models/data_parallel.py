"""Data parallelism among the sub-discriminators of one cluster (paper §3.3, Figure 6).

The root discriminator scatters the generator's n micro-batches to n
sub-discriminator processes; each computes gradients on its own micro-batch,
then they all-reduce (mean) the gradients over ``paddle.distributed`` with the
**gloo** backend on CPU, and every process applies the same update: the
parameters stay identical, equal to one process training on the concatenated
batch (exactly so when every micro-batch has the same number of attended and
masked tokens, since each loss is a per-micro-batch mean).

What works on paddle 3.3.1 CPU (checked): ``paddle.distributed.init_parallel_env()``
with ``PADDLE_TRAINER_ID``, ``PADDLE_TRAINERS_NUM``, ``PADDLE_TRAINER_ENDPOINTS``,
``PADDLE_CURRENT_ENDPOINT``, ``PADDLE_MASTER`` (the TCP store rank 0 serves) and
``PADDLE_DISTRI_BACKEND=gloo``; then ``all_reduce``, ``broadcast`` and ``barrier``.
Rendezvous costs about 3 s (a non-zero rank retries the store every 3 s).
All gradients go through one flat buffer: one collective per step, not one per
parameter. A process can join only one group in its lifetime.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import paddle
import paddle.distributed as dist
from paddle import nn

from nebula_mq.errors import WorkerError


class DataParallelGroup:
    """A joined gloo group; callable as a ``GradientSync`` for :class:`DiscriminatorTrainer`."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def __call__(self, model: nn.Layer) -> None:
        self.allreduce_gradients(model)

    def allreduce_gradients(self, model: nn.Layer) -> None:
        """Replace every parameter's gradient by its mean over the group (missing grads count as 0)."""
        params = [p for p in model.parameters() if not p.stop_gradient]
        grads = [p.grad if p.grad is not None else paddle.zeros(p.shape, dtype=p.dtype) for p in params]
        flat = paddle.concat([g.reshape([-1]) for g in grads])
        try:
            dist.all_reduce(flat)
        except (RuntimeError, OSError, ValueError) as exc:
            raise WorkerError(f"gradient all-reduce failed on rank {self.rank}: {exc}") from None
        flat = flat / float(self.world_size)
        offset = 0
        for p, g in zip(params, grads):
            n = int(np.prod(p.shape))
            mean = flat[offset : offset + n].reshape(p.shape)
            offset += n
            if p.grad is None:
                # No local gradient: give the parameter one so the optimiser updates it like the others.
                p._set_grad_ivar(mean)  # noqa: SLF001 - paddle's only way to attach a gradient
            else:
                p.grad.set_value(mean)

    def broadcast_parameters(self, model: nn.Layer, src: int = 0) -> None:
        """Make every rank's parameters equal to ``src``'s (use once after construction)."""
        try:
            for p in model.parameters():
                dist.broadcast(p, src=src)
        except (RuntimeError, OSError, ValueError) as exc:
            raise WorkerError(f"parameter broadcast failed on rank {self.rank}: {exc}") from None

    def barrier(self) -> None:
        """Wait for every rank (the sub-discriminators sync before the root syncs with G)."""
        try:
            dist.barrier()
        except (RuntimeError, OSError, ValueError) as exc:
            raise WorkerError(f"barrier failed on rank {self.rank}: {exc}") from None


def init_group(rank: int, world_size: int, endpoints: Sequence[str], master: str | None = None,
               ) -> DataParallelGroup:
    """Join the gloo group of ``world_size`` CPU processes; blocks until all have joined.

    ``endpoints`` are ``host:port`` per rank (paddle's launcher contract);
    ``master`` is the TCP store rank 0 serves for the rendezvous (default: the
    port 1 below the first endpoint's). Every rank must pass the same values.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise WorkerError(f"rank {rank} outside a group of {world_size}")
    if len(endpoints) != world_size or not all(_is_endpoint(e) for e in endpoints):
        raise WorkerError(f"need {world_size} 'host:port' endpoints, got {list(endpoints)}")
    if master is None:
        host, port = endpoints[0].rsplit(":", 1)
        master = f"{host}:{int(port) - 1}"
    if not _is_endpoint(master):
        raise WorkerError(f"master must be 'host:port', got {master!r}")
    os.environ.update({
        "PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(world_size),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints), "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
        "PADDLE_MASTER": master, "PADDLE_DISTRI_BACKEND": "gloo",
    })
    paddle.set_device("cpu")
    try:
        dist.init_parallel_env()
    except (RuntimeError, OSError, ValueError) as exc:
        raise WorkerError(f"cannot join the gloo group as rank {rank}/{world_size} via {master}: {exc}") from None
    if dist.get_rank() != rank or dist.get_world_size() != world_size:
        raise WorkerError(f"paddle reports rank {dist.get_rank()}/{dist.get_world_size()}, "
                          f"expected {rank}/{world_size}")
    return DataParallelGroup(rank, world_size)


def _is_endpoint(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
