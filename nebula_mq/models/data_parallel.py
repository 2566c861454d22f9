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
``PADDLE_DISTRI_BACKEND=gloo``; then ``all_reduce`` and ``barrier``.
Rendezvous costs about 3 s (a non-zero rank retries the store every 3 s).
All gradients go through one flat buffer: one collective per step, not one per
parameter. A process can join only one group in its lifetime.

**No collective waits for ever**: every collective and the rendezvous run under
:func:`nebula_mq.models.collectives.deadline`, which ends the process past ``timeout_s``
so the launcher restarts the group from its last common checkpoint.

On a GPU the group uses NCCL instead of gloo (untested here: no GPU on the
machine this runs on in CI).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Sequence

import numpy as np
import paddle
import paddle.distributed as dist
from paddle import nn

from nebula_mq.errors import WorkerError
from nebula_mq.models.collectives import DEFAULT_TIMEOUT_S, JoinedGroup, deadline, is_endpoint, warn_ephemeral_ports
from nebula_mq.runtime.logs import get_logger

log = get_logger(__name__)


class DataParallelGroup(JoinedGroup):
    """A joined gloo (CPU) or NCCL (GPU) group; callable as a ``GradientSync`` for
    :class:`DiscriminatorTrainer`."""

    def __call__(self, model: nn.Layer) -> None:
        self.allreduce_gradients(model)

    def allreduce_gradients(self, model: nn.Layer | Sequence[paddle.Tensor], op: str = "mean",
                            extra: Sequence[float] = ()) -> np.ndarray:
        """Replace every trainable parameter's gradient by its mean (``op="sum"``: its sum) over
        the group; missing grads count as 0. ``extra`` values ride in the same collective
        (summed over the ranks, e.g. a stop flag) and come back."""
        params = ([p for p in model.parameters() if not p.stop_gradient] if isinstance(model, nn.Layer)
                  else list(model))
        grads = [p.grad if p.grad is not None else paddle.zeros(p.shape, dtype=p.dtype) for p in params]
        flat = paddle.concat([g.reshape([-1]) for g in grads]
                             + [paddle.to_tensor(np.asarray(extra, np.float32))])
        self._run("gradient all-reduce", dist.all_reduce, flat)
        riders = flat[flat.shape[0] - len(extra):].numpy() if extra else np.zeros(0, np.float32)
        if op == "mean":
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
        return riders

    def min_int(self, value: int) -> int:
        """The smallest ``value`` over the ranks (the group's common checkpoint step)."""
        t = paddle.to_tensor(np.array([value], np.int64))
        self._run("checkpoint agreement", dist.all_reduce, t, op=dist.ReduceOp.MIN)
        return int(t.numpy()[0])

    def sum_floats(self, values: np.ndarray) -> np.ndarray:
        """``values`` summed over the ranks (a step's metrics and stop votes), same dtype."""
        t = paddle.to_tensor(np.asarray(values))
        self._run("step agreement", dist.all_reduce, t)
        return np.asarray(t.numpy())

    def barrier(self) -> None:
        """Wait for every rank (the sub-discriminators sync before the root syncs with G)."""
        self._run("barrier", dist.barrier)


def init_group(rank: int, world_size: int, endpoints: Sequence[str], master: str | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S) -> DataParallelGroup:
    """Join the group of ``world_size`` processes; blocks until all have joined, at most
    ``timeout_s`` (then the process exits: see the module docstring). The backend follows
    the device paddle was set to: NCCL on a GPU, gloo on the CPU.

    ``endpoints`` are ``host:port`` per rank (paddle's launcher contract);
    ``master`` is the TCP store rank 0 serves for the rendezvous (default: the
    port 1 below the first endpoint's). Every rank must pass the same values.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise WorkerError(f"rank {rank} outside a group of {world_size}")
    if len(endpoints) != world_size or not all(is_endpoint(e) for e in endpoints):
        raise WorkerError(f"need {world_size} 'host:port' endpoints, got {list(endpoints)}")
    if master is None:
        host, port = endpoints[0].rsplit(":", 1)
        master = f"{host}:{int(port) - 1}"
    if not is_endpoint(master):
        raise WorkerError(f"master must be 'host:port', got {master!r}")
    warn_ephemeral_ports([master, endpoints[rank]])
    os.environ.update({
        "PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": str(world_size),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints), "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
        "PADDLE_MASTER": master,
        "PADDLE_DISTRI_BACKEND": "nccl" if paddle.get_device().startswith("gpu") else "gloo",
    })
    banner = io.StringIO()  # paddle writes its "Modified FLAGS detected" banner to sys.stderr
    try:
        with deadline("group rendezvous", rank, timeout_s), contextlib.redirect_stderr(banner):
            dist.init_parallel_env()
    except (RuntimeError, OSError, ValueError) as exc:
        raise WorkerError(f"cannot join the gloo group as rank {rank}/{world_size} via {master}: {exc}") from None
    if banner.getvalue().strip():  # one log line, not a block of text in a JSON log
        log.info("paddle_distributed_output", text=" ".join(banner.getvalue().split()))
    if dist.get_rank() != rank or dist.get_world_size() != world_size:
        raise WorkerError(f"paddle reports rank {dist.get_rank()}/{dist.get_world_size()}, "
                          f"expected {rank}/{world_size}")
    return DataParallelGroup(rank, world_size, timeout_s)
