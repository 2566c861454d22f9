"""The few-lines API: run one half of your own split model (Paddle or PyTorch) on this cluster.

    # cluster S                                   # cluster T
    from workers.split import run_head             from workers.split import run_tail
    run_head("job.toml", model=Bottom(),           run_tail("job.toml", model=Top(),
             inputs=batch)                                  loss=mse, targets=labels)

``model`` is a ``paddle.nn.Layer`` or a ``torch.nn.Module``, and ``loss`` a function of
the same framework; each side picks its own (a Paddle head trains with a PyTorch
tail: only numpy arrays cross). ``job.toml`` names the codec chains (``[codec] forward``
for activations, ``backward`` for gradients) and the ``[split]`` section
(``workers.split.job.SplitJob``: in_flight, checkpoint_every, lr...).

The broker is this host's stack, as for ``nebula-mq up`` and ``worker``: ``stack`` (default
``$NEBULA_RUN_DIR``, else ``run/stack``), reached by ``broker_host`` (default
``$NEBULA_BROKER_HOST``) from a host of the cluster without its broker. On the broker's host
the script joins the job first, as ``up`` does (``nebula_mq.stack.joining``: peers trusted,
the job provisioned, key and job file shared with the peer's); on another host it waits for
the key. A job file with a ``[clusters.<name>.broker]`` table for the side's cluster, or a
``transport``, takes the broker from there instead.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from workers.registry import load_job_settings
from workers.split.job import HEAD_ROLE, TAIL_ROLE, HeadSpec, InputsFn, LossFn, OptimizerFn, TailSpec, TargetsFn
from workers.split.trained import export, load, predict

if TYPE_CHECKING:
    from workers.processes import Plan, Process
    from workers.split.side import SplitSide

__all__ = ["HeadSpec", "TailSpec", "export", "load", "predict", "run_head", "run_tail"]


def _settings(job: str | os.PathLike[str] | Settings) -> Settings:
    from nebula_mq.models.cpu import configure_cpu
    from nebula_mq.runtime.logs import configure_logging, logging_configured

    if not logging_configured():  # a script's own: our lines readable, the libraries' chatter quiet
        configure_logging("info")

    # MKL's fast path on AMD, this process's share of the cores; paddle's threads are set by its
    # adapter if the model is paddle's (a torch model's process never loads paddle).
    configure_cpu(paddle=False)
    return job if isinstance(job, Settings) else load_job_settings(job)


def run_head(job: str | os.PathLike[str] | Settings, *, model: object, inputs: InputsFn,
             optimizer_fn: OptimizerFn | None = None, transport: Transport | None = None,
             rank: int = 0, stack: str | None = None, broker_host: str | None = None) -> int:
    """Train the head half until ``job.steps`` gradients are applied (or SIGTERM); exit code.

    ``inputs(micro_batch) -> (sample_ids, *arrays)`` must be deterministic in the index and
    return the whole micro-batch: rank ``rank`` of ``[split] head_ranks`` takes its share.
    ``transport`` defaults to the RabbitMQ broker of ``[split] head_cluster``. A mistake (in
    the job file, the model, the data, the placement) is one line on stderr and exit code 1."""
    def side(settings: Settings) -> SplitSide:
        from workers.split.head import SpecHead

        identity = SpecHead.identity(settings, rank)
        worker = identity.worker(transport) if transport is not None else identity.broker_worker()
        return SpecHead(settings, HeadSpec(model, inputs, optimizer_fn), worker, rank)

    return _run(job, HEAD_ROLE, rank, side, transport is None, stack, broker_host)


def run_tail(job: str | os.PathLike[str] | Settings, *, model: object, loss: LossFn, targets: TargetsFn,
             optimizer_fn: OptimizerFn | None = None, transport: Transport | None = None,
             rank: int = 0, stack: str | None = None, broker_host: str | None = None,
             baseline: float | None = None) -> int:
    """Train the tail half: ``loss(model(activation), *targets(sample_ids))``; exit code.
    ``loss`` must be a mean over the samples for ranks to train the 1 x 1 model; ``baseline``:
    what a model that learnt nothing scores on it, printed beside it at the end. A mistake is
    one line on stderr and exit code 1, as for :func:`run_head`."""
    def side(settings: Settings) -> SplitSide:
        from workers.split.tail import SpecTail

        identity = SpecTail.identity(settings, rank)
        worker = identity.worker(transport) if transport is not None else identity.broker_worker()
        return SpecTail(settings, TailSpec(model, loss, targets, optimizer_fn, baseline), worker, rank)

    return _run(job, TAIL_ROLE, rank, side, transport is None, stack, broker_host)


def _run(job: str | os.PathLike[str] | Settings, role: str, rank: int, make: Callable[[Settings], SplitSide],
         on_broker: bool, stack: str | None, broker_host: str | None) -> int:
    """Claim the rank (``workers.claim``), find its broker (``on_broker``: a RabbitMQ broker, from
    the job file or this host's stack), build its side and drive it to its end; on the main
    thread SIGTERM finishes, checkpoints and exits 0. Our typed errors end as one line."""
    from nebula_mq.errors import NebulaError, after_name, one_line
    from nebula_mq.report.derive import loss_summary
    from nebula_mq.runtime.driver import Driver
    from workers.claim import claim_rank
    from workers.plans import plan_for

    who, worker_id = f"{role} rank {rank}", ""
    try:
        settings = _settings(job)
        plan = plan_for(settings)
        proc = plan.find(role, rank)
        who, worker_id = f"{proc.worker_id} ({proc.cluster})", proc.worker_id
        claim = claim_rank(settings, proc, "a script (run_head/run_tail)")
        try:
            named = settings.clusters.get(proc.cluster)
            if on_broker and (named is None or not named.names_broker):
                settings = _joined(settings, plan, proc, stack, broker_host)
            side = make(settings)
            driver = Driver(side.worker, side)
            if threading.current_thread() is threading.main_thread():
                driver.install_signal_handlers()
            code = driver.main()
            summary = loss_summary(settings.run_dir, [proc.worker_id])
            if summary:
                print(summary, file=sys.stderr)
            return code
        finally:
            claim.release()
    except NebulaError as exc:
        print(f"nebula-mq: error: {who}: {after_name(worker_id, one_line(exc))}", file=sys.stderr)
        return 1


def _joined(settings: Settings, plan: Plan, proc: Process, stack_dir: str | None, broker_host: str | None) -> Settings:
    """``settings`` with ``proc``'s broker taken from this host's stack, once this host has joined
    the job (``nebula_mq.stack.joining.join``: what ``nebula-mq up`` does before it starts workers)."""
    from nebula_mq.stack import Stack
    from nebula_mq.stack.joining import join
    from nebula_mq.stack.layout import default_run_dir
    from workers.plans import with_stack_broker
    from workers.registry import scenario_of

    host = os.environ.get("NEBULA_BROKER_HOST", "") if broker_host is None else broker_host
    stack = Stack.open(stack_dir or default_run_dir())
    join(settings, plan, proc.cluster, stack, host, scenario_of(settings).section,
         say=lambda line: print(line, file=sys.stderr, flush=True))
    return with_stack_broker(settings, stack, proc, host)
