"""ELECTRA discriminator ranks (cluster B): the step every rank takes, and the sub-discriminator role.

The discriminator group has ``n_sub`` ranks: rank 0 is the root
(``workers.electra.root``), ranks 1.. are sub-discriminators that consume
their share from the ``sub-disc-<rank>`` queue. Every rank, every step: take
its K shares of the step (one per generator, concatenated into one batch),
compute λ·L_D + γ·L_CLM, all-reduce the gradients over gloo, apply the same
AdamW step, then all-reduce the step's metrics and the stop votes (the "subs
sync first" of §3.3); only then does the root send the sync token to G.

A rank is a plain role run by the runtime's driver (``nebula_mq.runtime.driver``),
which orders its shares, counts its steps and checkpoints them. Checkpoints are
group-wide at the same steps: every rank saves, a barrier, then every rank acks
what its checkpoint covers (the root: ``gen-results``), through the worker's
:class:`~nebula_mq.runtime.agreement.Agreement` with the group. A restart agrees on
the lowest latest step over the ranks (all-reduce MIN) and every rank loads its
checkpoint at that step; no rank acked anything past it, so every share of later
steps is still unacked on ``gen-results`` and is re-scattered with the same ids
(ranks drop the copies they hold). A rank with no checkpoint of its own may start
from a previous job's (``[electra] init_from``: a hot start).

**When a rank crashes** the others block in the next collective: the group is
restarted together (all ranks, a new gloo rendezvous: a process joins one
group in its lifetime) and resumes from the last group checkpoint (the
launcher's job: gloo has no membership change). A stop request (SIGTERM) is
carried in the step's all-reduce and takes effect at that step boundary on
every rank at once; a rank asked to stop that has nothing to apply leaves
without its group (its peers are stopping too: ``runtime.agreement``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nebula_mq.errors import WorkerError
from nebula_mq.models.device import use_device
from nebula_mq.models.electra_trainers import DiscriminatorTrainer
from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.checkpoint import Checkpoint, CheckpointStore
from nebula_mq.runtime.driver import Extras, StepInputs, StopCheck, drive
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from workers.base import WorkerIdentity
from workers.electra.common import PADDLE_TURN, SUB_ROLE, disc_rank_id
from workers.electra.data import load_data, pretrained_discriminator
from workers.electra.flows import flow_named, flows, sub_discriminator_flow
from workers.electra.job import load_job
from workers.registry import role

log = get_logger(__name__)

METRICS = ("disc_loss", "rtd_loss", "clm_loss", "rtd_acc", "clm_acc", "mlm_loss", "total_loss")

if TYPE_CHECKING:
    from nebula_mq.models.data_parallel import DataParallelGroup


def concat_shares(shares: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """K micro-batches (one per generator) as one batch; L_G is their mean."""
    out = {k: np.concatenate([s[k] for s in shares]) for k in shares[0] if k != "mlm_loss"}
    out["mlm_loss"] = np.array([np.mean([float(s["mlm_loss"][0]) for s in shares])], dtype=np.float32)
    return out


class DiscriminatorRank:
    """What every rank does (its trainer, its group, its checkpoint and its step); the root
    and the sub-discriminator say where a step's shares come from (:meth:`inputs`)."""

    role: str  # names the role in status, metrics and logs

    @classmethod
    def identity(cls, settings: Settings, rank: int) -> WorkerIdentity:
        """The worker of discriminator rank ``rank``: its cluster and id."""
        job = load_job(settings)
        return WorkerIdentity(settings, job.disc_cluster, disc_rank_id(rank), cls.role, job.checkpoint_every)

    def __init__(self, settings: Settings, worker: Worker, rank: int) -> None:
        """``worker``: of ``identity(settings, rank)``."""
        self.job = load_job(settings)
        self.worker = worker
        self.rank, self.world = rank, self.job.n
        if self.world > 1:  # a rank started on a host that is not its own: one line, before it connects
            self.job.group_address(self.world).bind_env(rank)
        use_device(settings.job.device, rank, "job.device", settings.source or "<settings>")  # the trainer, its optimizer and the group follow it
        data = load_data(settings, self.job)  # the shared pruned vocabulary
        self.cfg = data.cfg
        self.k_gen = len(self.cfg.generators)
        with PADDLE_TURN:
            # Every rank reads the same pretrained tensors (pretrained preset), so the group
            # starts identical without a broadcast; a checkpoint, if any, replaces them in load().
            self.trainer = DiscriminatorTrainer(self.cfg, pretrained=pretrained_discriminator(data))
        self.flows = flows(self.job)
        self.group: DataParallelGroup | None = None  # joined when world > 1
        self.total = settings.job.steps
        # The generator runs up to max_lead steps ahead, plus the step in flight and the sync
        # token on its way (the driver adds what may come before our checkpoint catches up).
        self.in_flight = self.job.max_lead + 3

    # ------------------------------------------------------------------ group

    def join_group(self) -> None:
        if self.world == 1:
            return
        from nebula_mq.models.frameworks.paddle_backend import PaddleFramework

        self.group = PaddleFramework().join_group(self.rank, self.job.group_address(self.world), self.job.group_timeout_s)
        self.trainer.gradient_sync = self.group
        self.worker.join(self.group)

    # ------------------------------------------------------------------ checkpoint

    def extras(self) -> Extras:
        return Extras(resume_store=self.resume_store)

    def resume_store(self) -> CheckpointStore:
        """This rank's store, or with none of its checkpoints and ``init_from`` set, the same
        rank's store of that job (a hot start)."""
        if not self.worker.store.steps() and self.job.init_from:
            log.info("hot_start", source=self.job.init_from)
            return CheckpointStore(Path(self.job.init_from) / "checkpoints" / self.worker.worker_id)
        return self.worker.store

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        with PADDLE_TURN:
            return self.trainer.state_arrays(), {}

    def load(self, ck: Checkpoint) -> None:
        with PADDLE_TURN:
            self.trainer.load_state_arrays(ck.arrays)

    # ------------------------------------------------------------------ the role (runtime.driver)

    def declare(self) -> None:
        """Declare this rank's queues and open its outboxes."""

    def open(self) -> None:
        self.declare()
        self.join_group()

    def close(self) -> None:
        """Close what :meth:`declare` opened."""

    def produce(self, stopping: StopCheck) -> None:
        """Nothing: a rank sends only what a step makes."""

    def train(self, shares: list[Received]) -> dict[str, float]:
        """One group step at the worker's step on this rank's K shares (generator order): the
        step's metrics averaged over the ranks and this rank's learning rate (``lr``); the
        group's stop votes are counted."""
        w = self.worker
        bind_context(step=w.step)
        with PADDLE_TURN:  # the gradient all-reduce inside waits for the other ranks, not threads
            metrics = self.trainer.train_step(concat_shares([dict(r.tensors) for r in shares]))
        local = [metrics[k] for k in METRICS]
        group = self.group
        summed = local if group is None else w.agreement.voted(  # every rank is done
            lambda values: group.sum_floats(np.array(values, np.float64)), *local)
        return {**{k: float(v) / self.world for k, v in zip(METRICS, summed)}, "lr": metrics["lr"]}


class ElectraSub(DiscriminatorRank):
    """Rank >= 1: trains on the shares the root scatters to ``sub-disc-<rank>``, the K of a
    step in a row (``micro_batch = step * K + generator``, the driver's cursor)."""

    role = SUB_ROLE

    def __init__(self, settings: Settings, worker: Worker, rank: int) -> None:
        super().__init__(settings, worker, rank)
        if not 1 <= rank < self.world:
            raise WorkerError(f"sub-discriminator rank {rank} outside 1..{self.world - 1} (n_sub = {self.world})")
        self.flow = flow_named(self.flows, sub_discriminator_flow(rank))

    def inputs(self) -> StepInputs:
        return StepInputs((self.flow,), per_step=self.k_gen)

    def declare(self) -> None:
        self.worker.transport.declare_flow(self.flow, "consumer")

    def apply(self, parts: tuple[Received, ...]) -> dict[str, float]:
        return self.train(list(parts))


@role(SUB_ROLE)
def main(settings: Settings, worker_index: int = 1) -> int:
    """``worker_index`` is the rank (1..n_sub-1); rank 0 is ``electra-root``."""
    worker = ElectraSub.identity(settings, worker_index).broker_worker()
    return drive(worker, ElectraSub(settings, worker, worker_index))
