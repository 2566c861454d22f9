"""What both sides of a split model share: flows, model, optimizer, their checkpoint, and the
data-parallel group of the side's ranks.

The loop, the ordering, the acks and the checkpoint schedule belong to the runtime's
driver (:class:`~nebula_mq.runtime.driver.Driver`); the head and the tail
(``workers.split.head``, ``workers.split.tail``) are plain roles that say what one
step does, each given its :class:`~nebula_mq.runtime.worker.Worker` (built by the entry
point from the rank's :meth:`SplitSide.identity`). This is the
state they both keep: the model's trainable weights and the optimizer, the
learning-rate schedule, and each flow's compression state
(:class:`~nebula_mq.codecs.flow.FlowCompression`, one per peer rank), saved and
restored together.

**Ranks.** A side of ``R > 1`` ranks (``[split] head_ranks`` / ``tail_ranks``)
is one group (gloo on CPUs, NCCL on GPUs, joined through the side's framework:
``nebula_mq.models.frameworks``). Every step each rank
all-reduces its gradients, so every rank of a side holds the same weights;
the step's stop flags ride in the same collective, so all ranks stop at the same
step (the group's :class:`~nebula_mq.runtime.agreement.Agreement`: it also holds
the acks of a checkpoint until every rank holds it, and resumes a restarted group
from the lowest step all its ranks hold).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any, Literal

import numpy as np

from nebula_mq.codecs.flow import FlowCompression
from nebula_mq.errors import NonFiniteTensor, ShapeMismatch
from nebula_mq.models.frameworks import Framework, Group, framework_named
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.checkpoint import Checkpoint
from nebula_mq.runtime.driver import Extras, StepInputs, StopCheck
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from workers.base import WorkerIdentity
from workers.split.job import Placement, load_split_job, micro_batch_seed


@contextmanager
def named_tensor_errors(what: str) -> Iterator[None]:
    """A tensor the codec refuses (NaN or Inf, a wrong shape) is named: which worker, which
    tensor, which micro-batch; raised before anything of that message is sent."""
    try:
        yield
    except (NonFiniteTensor, ShapeMismatch) as exc:
        raise type(exc)(f"{what}: {exc}") from None


def peer_prefix(prefix: str, peer: int) -> str:
    """Checkpoint prefix of the compression state shared with peer rank ``peer`` (peer 0
    keeps the 1 x 1 names)."""
    return prefix if peer == 0 else f"{prefix}/peer{peer}"


class SplitSide(ABC):
    """One rank of one side of a split: the activation flows (head -> tail) and the replies.
    A role of the runtime's driver (``runtime.driver.StepRole``), given its worker."""

    role: str  # names the role in status, metrics and logs
    side: Literal["head", "tail"]
    state_prefix: str  # names this side's arrays in the checkpoint
    activation_name = "activation"  # tensor name of the activation in the message
    # How the side's ranks combine their gradients (workers.split.shards): the head's ranks
    # each hold a part of the global gradient (sum), the tail's a mean over equal shares.
    gradient_op: Literal["sum", "mean"]
    sources: tuple[str, ...]  # the peer ranks whose messages make a step (empty: one peer)
    outboxes: list[Outbox]  # opened by open(): to the peer ranks
    model: Any  # a paddle.nn.Layer or a torch.nn.Module: self.fw says which
    optimizer: Any

    @classmethod
    def placement_of(cls, settings: Settings) -> Placement:
        """Where this side's job puts the head and the tail (``[split]`` unless a subclass says)."""
        return load_split_job(settings)

    @classmethod
    def identity(cls, settings: Settings, rank: int = 0) -> WorkerIdentity:
        """The worker of this side's rank ``rank``: its cluster and id."""
        job = cls.placement_of(settings)
        ids = job.head_ids() if cls.side == "head" else job.tail_ids()
        if not 0 <= rank < len(ids):
            from nebula_mq.errors import WorkerError

            raise WorkerError(f"{cls.side} rank {rank} outside 0..{len(ids) - 1} ({cls.side}_ranks = {len(ids)})")
        return WorkerIdentity(settings, job.head_cluster if cls.side == "head" else job.tail_cluster, ids[rank],
                              cls.role, job.checkpoint_every)

    def __init__(self, settings: Settings, job: Placement, worker: Worker, rank: int,
                 framework: Framework | None = None) -> None:
        """``worker``: rank ``rank``'s, of :meth:`identity`."""
        head = self.side == "head"
        self.settings, self.worker, self.worker_id = settings, worker, worker.worker_id
        self.placement, self.rank, self.world = job, rank, len(job.head_ids() if head else job.tail_ids())
        self.ranks = job.ranks
        self.in_flight = job.in_flight
        self.total = settings.job.steps
        self.act_flows, self.reply_flows = job.activation_flows(), job.reply_flows()
        # Everything framework-specific this side does (models.frameworks); paddle unless given.
        self.fw: Framework = framework if framework is not None else framework_named("paddle")
        override = job.head_device if head else job.tail_device
        self.device = self.fw.place(override or settings.job.device, rank,
                                    f"{settings.job.scenario}.{self.side}_device" if override else "job.device",
                                    settings.source or "<settings>")
        self.group: Group | None = None
        if self.world > 1:  # a rank started on a host that is not its own: one line, before it connects
            job.group_address(self.side).bind_env(rank)

    def take_model(self, model: Any, optimizer_fn: Any) -> None:
        """A user's model on this side's device, and its optimizer: ``optimizer_fn(params, lr)``,
        or Adam at ``[split] lr`` in the model's framework."""
        self.model = self.fw.to_device(model)
        build = optimizer_fn or self.fw.default_optimizer
        self.optimizer = build(self.fw.trainable(self.model), self.placement.lr)

    @abstractmethod
    def produce(self, stopping: StopCheck) -> None:
        """Send what may be sent before the next wait (``runtime.driver.StepRole``)."""

    @abstractmethod
    def apply(self, parts: tuple[Received, ...]) -> Mapping[str, float]:
        """One step's messages, one from each peer rank; the step's values."""

    @abstractmethod
    def inputs(self) -> StepInputs:
        """The flow whose messages are this side's steps, one stream per peer rank."""

    @abstractmethod
    def extras(self) -> Extras:
        """What the side does besides its step: its check of each message (``admit``)."""

    @abstractmethod
    def compressions(self) -> tuple[tuple[str, FlowCompression], ...]:
        """This rank's ends of the flows' compression, each with its checkpoint prefix."""

    def seed(self, stream: str, mb: int) -> int:
        """Dropout seed of micro-batch ``mb`` on this rank: rank 0 draws what a 1 x 1 run draws,
        every other rank its own (its shard is other samples)."""
        return micro_batch_seed(self.settings.job.seed, stream if self.rank == 0 else f"{stream}/rank{self.rank}", mb)

    # ------------------------------------------------------------------ the group

    def open(self) -> None:
        if self.world == 1:
            return
        job = self.placement
        self.group = self.fw.join_group(self.rank, job.group_address(self.side), job.group_timeout_s)
        self.worker.join(self.group)

    def close(self) -> None:
        """Close the outboxes the side opened (``open``), waiting for their confirms."""
        for outbox in self.outboxes:
            outbox.close()

    def peer_of(self, received: Received) -> int:
        """The peer rank that sent ``received`` (the driver has checked it is one of ``sources``)."""
        return self.sources.index(received.envelope.producer) if self.sources else 0

    # ------------------------------------------------------------------ optimizer

    def learning_rate(self, step: int) -> float | None:
        """The learning rate of the update that makes ``step + 1`` (None: as the optimizer was built).

        A function of the step alone, so a resumed worker needs no scheduler state."""
        return None

    def step_optimizer(self) -> None:
        if self.group is not None:  # the stop votes ride in the gradients' all-reduce
            self.worker.agreement.voted(partial(self.group.allreduce_gradients, self.fw.trainable(self.model),
                                                self.gradient_op))
        self.fw.step(self.optimizer, self.learning_rate(self.worker.step))

    # ------------------------------------------------------------------ checkpoint

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = self.fw.state_arrays(self.state_prefix, self.model, self.optimizer)
        for prefix, compression in self.compressions():
            arrays.update(compression.state_arrays(prefix))
        return arrays, {}

    def load(self, ck: Checkpoint) -> None:
        self.fw.load_state_arrays(self.state_prefix, self.model, self.optimizer, ck.arrays)
        for prefix, compression in self.compressions():
            compression.restore(ck.arrays, prefix)
