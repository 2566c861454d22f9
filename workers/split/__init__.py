"""The few-lines API: run one half of your own split model (Paddle or PyTorch) on this cluster.

    # cluster S                                   # cluster T
    from workers.split import run_head             from workers.split import run_tail
    run_head("job.toml", model=Bottom(),           run_tail("job.toml", model=Top(),
             inputs=batch)                                  loss=mse, targets=labels)

``model`` is a ``paddle.nn.Layer`` or a ``torch.nn.Module``, and ``loss`` a function of
the same framework; each side picks its own (a Paddle head trains with a PyTorch
tail: only numpy arrays cross). ``job.toml`` names the clusters (brokers), the codec chains (``[codec] forward``
for activations, ``backward`` for gradients) and the ``[split]`` section
(``workers.split.job.SplitJob``: in_flight, checkpoint_every, lr...).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from workers.registry import load_job_settings
from workers.split.job import HeadSpec, InputsFn, LossFn, OptimizerFn, TailSpec, TargetsFn
from workers.split.trained import export, load, predict

if TYPE_CHECKING:
    from workers.split.side import SplitSide

__all__ = ["HeadSpec", "TailSpec", "export", "load", "predict", "run_head", "run_tail"]


def _settings(job: str | os.PathLike[str] | Settings) -> Settings:
    from nebula_mq.models.cpu import configure_cpu

    # MKL's fast path on AMD, this process's share of the cores; paddle's threads are set by its
    # adapter if the model is paddle's (a torch model's process never loads paddle).
    configure_cpu(paddle=False)
    return job if isinstance(job, Settings) else load_job_settings(job)


def run_head(job: str | os.PathLike[str] | Settings, *, model: object, inputs: InputsFn,
             optimizer_fn: OptimizerFn | None = None, transport: Transport | None = None,
             rank: int = 0) -> int:
    """Train the head half until ``job.steps`` gradients are applied (or SIGTERM); exit code.

    ``inputs(micro_batch) -> (sample_ids, *arrays)`` must be deterministic in the index and
    return the whole micro-batch: rank ``rank`` of ``[split] head_ranks`` takes its share.
    ``transport`` defaults to the RabbitMQ broker of ``[split] head_cluster``."""
    from workers.split.head import SpecHead

    return _run(SpecHead(_settings(job), HeadSpec(model, inputs, optimizer_fn), transport, rank=rank))


def run_tail(job: str | os.PathLike[str] | Settings, *, model: object, loss: LossFn, targets: TargetsFn,
             optimizer_fn: OptimizerFn | None = None, transport: Transport | None = None,
             rank: int = 0) -> int:
    """Train the tail half: ``loss(model(activation), *targets(sample_ids))``; exit code.
    ``loss`` must be a mean over the samples for ranks to train the 1 x 1 model."""
    from workers.split.tail import SpecTail

    return _run(SpecTail(_settings(job), TailSpec(model, loss, targets, optimizer_fn), transport, rank=rank))


def _run(side: SplitSide) -> int:
    """Drive ``side`` to its end; on the main thread SIGTERM finishes, checkpoints and exits 0."""
    from nebula_mq.runtime.driver import Driver

    driver = Driver(side.worker, side)
    if threading.current_thread() is threading.main_thread():
        driver.install_signal_handlers()
    return driver.main()
