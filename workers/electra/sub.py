"""ELECTRA discriminator ranks (cluster B): the shared rank loop, and the sub-discriminator role.

The discriminator group has ``n_sub`` ranks: rank 0 is the root
(``workers.electra.root``), ranks 1.. are sub-discriminators that consume
their share from the ``sub-disc-<rank>`` queue. Every rank, every step: take
its K shares of the step (one per generator, concatenated into one batch),
compute λ·L_D + γ·L_CLM, all-reduce the gradients over gloo, apply the same
AdamW step, then all-reduce the step's metrics and the stop flag (the "subs
sync first" of §3.3); only then does the root send the sync token to G.

Checkpoints are group-wide at the same steps: every rank saves, a barrier, then
every rank acks what its checkpoint covers (the root: ``gen-results``), as every
group does (``runtime.agreement``). A restart agrees on the lowest latest step
over the ranks (all-reduce MIN) and every rank loads its checkpoint at that step;
no rank acked anything past it, so every share of later steps is still unacked
on ``gen-results`` and is re-scattered with the same ids (ranks drop the copies
they hold).

**When a rank crashes** the others block in the next collective: the group is
restarted together (all ranks, a new gloo rendezvous: a process joins one
group in its lifetime) and resumes from the last group checkpoint (the
launcher's job: gloo has no membership change). A stop request (SIGTERM) is
carried in the step's all-reduce and takes effect at that step boundary on
every rank at once; a rank of a group whose peers are gone does not exit on
SIGTERM while it waits for shares (a peer may still need it): kill it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nebula_mq import topology
from nebula_mq.errors import WorkerError
from nebula_mq.models.device import use_device
from nebula_mq.models.electra_trainers import DiscriminatorTrainer
from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.agreement import Agreement
from nebula_mq.runtime.checkpoint import Checkpoint, CheckpointStore
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.loop import LoopWorker
from nebula_mq.runtime.ordered import FlowWindow, OrderedInbox, OrderedStreams
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from workers.base import RoleWorker
from workers.electra.common import PADDLE_TURN, disc_rank_id
from workers.electra.data import load_data, pretrained_discriminator
from workers.electra.flows import flow_named, flows
from workers.electra.job import load_job
from workers.registry import role

log = get_logger(__name__)

ROLE = "electra-sub"
METRICS = ("disc_loss", "rtd_loss", "clm_loss", "rtd_acc", "clm_acc", "mlm_loss", "total_loss")

if TYPE_CHECKING:
    from nebula_mq.models.data_parallel import DataParallelGroup


def concat_shares(shares: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """K micro-batches (one per generator) as one batch; L_G is their mean."""
    out = {k: np.concatenate([s[k] for s in shares]) for k in shares[0] if k != "mlm_loss"}
    out["mlm_loss"] = np.array([np.mean([float(s["mlm_loss"][0]) for s in shares])], dtype=np.float32)
    return out


class DiscriminatorRank(LoopWorker[OrderedStreams], RoleWorker):
    """The rank loop; subclasses say where a step's shares come from."""

    def __init__(self, settings: Settings, rank: int, transport: Transport | None = None) -> None:
        self.job = load_job(settings)
        super().__init__(settings, self.job.disc_cluster, disc_rank_id(rank), transport,
                         checkpoint_every=self.job.checkpoint_every)
        self.rank, self.world = rank, self.job.n
        use_device(settings.job.device, rank)  # the trainer, its optimizer and the group follow it
        data = load_data(settings, self.job)  # the shared pruned vocabulary
        self.cfg = data.cfg
        self.k_gen = len(self.cfg.generators)
        with PADDLE_TURN:
            # Every rank reads the same pretrained tensors (pretrained preset), so the group
            # starts identical without a broadcast; a checkpoint, if any, replaces them in restore().
            self.trainer = DiscriminatorTrainer(self.cfg, pretrained=pretrained_discriminator(data))
        self.flows = flows(self.job)
        self.group: DataParallelGroup | None = None  # joined when world > 1
        # Deliveries recorded and acked with a step besides its own shares (the root's scattered ones).
        self.riders: dict[int, list[Received]] = {}
        self.total = settings.job.steps

    # ------------------------------------------------------------------ group

    def join_group(self) -> None:
        if self.world == 1:
            return
        from nebula_mq.models.data_parallel import init_group

        host, base = self.job.gloo_host, self.job.gloo_base_port
        endpoints = [f"{host}:{base + 1 + r}" for r in range(self.world)]
        self.group = init_group(self.rank, self.world, endpoints, master=f"{host}:{base}")
        self.trainer.gradient_sync = self.group
        self.agreement = Agreement(self.stop_requested, self.group)

    # ------------------------------------------------------------------ checkpoint

    def _source(self) -> tuple[CheckpointStore, bool]:
        if not self.store.steps() and self.job.init_from:
            return CheckpointStore(Path(self.job.init_from) / "checkpoints" / self.worker_id), True
        return self.store, False

    def restore(self) -> None:
        """Agree on the group's start step, then load this rank's checkpoint there."""
        store, hot_start = self._source()
        start = self.agreement.start_step(store.steps(), self.worker_id)
        if start is None:
            return
        ck = store.load(start)
        with PADDLE_TURN:
            self.trainer.load_state_arrays(ck.arrays)
        self.step = ck.step
        self.on_restore(ck)
        log.info("resumed", step=self.step, hot_start=hot_start)

    def on_restore(self, ck: Checkpoint) -> None:
        """Subclass state kept in the checkpoint meta."""

    def checkpoint(self) -> None:
        """Every rank saves, then acks once all ranks hold the step (``Worker.commit``)."""
        with PADDLE_TURN:
            arrays = self.trainer.state_arrays()
        self.commit(arrays, {})
        self.write_history()

    # ------------------------------------------------------------------ loop

    def window(self, per_step: int) -> FlowWindow:
        """A stream with ``per_step`` messages a step: the generator runs up to ``max_lead``
        steps ahead, plus the step in flight and the sync token on its way (3); up to
        ``checkpoint_every`` applied steps wait for the next checkpoint."""
        return FlowWindow(ahead=(self.job.max_lead + 3) * per_step, unacked=self.checkpoint_every * per_step)

    def declare(self) -> None:
        raise NotImplementedError

    def next_shares(self, inbox: OrderedStreams) -> list[Received] | None:
        """This rank's K messages of ``self.step`` in generator order; None on a stop request."""
        raise NotImplementedError

    def after_step(self, metrics: dict[str, float]) -> None:
        """The root sends the sync token here."""

    # ------------------------------------------------------------------ the runtime's loop (runtime.loop)

    def open(self) -> None:
        self.declare()
        self.join_group()

    def keep_going(self) -> bool:
        # Not the stop flag: the group agrees on a stop in train(), or one rank would leave
        # the others waiting in the next all-reduce.
        return self.step < self.total

    def advance(self, inbox: OrderedStreams) -> bool:
        """One group step: this rank's shares, trained; a checkpoint on schedule or on a stop."""
        shares = self.next_shares(inbox)
        if shares is None:
            return False
        stop = self.train(inbox, shares)
        if self.step % self.checkpoint_every == 0 or self.step == self.total or stop:
            self.checkpoint()
        return not stop

    def train(self, inbox: OrderedStreams, shares: list[Received]) -> bool:
        """One group step; returns whether any rank asked to stop."""
        bind_context(step=self.step)
        t0 = time.perf_counter()
        with PADDLE_TURN:  # the gradient all-reduce inside waits for the other ranks, not threads
            metrics = self.trainer.train_step(concat_shares([dict(r.tensors) for r in shares]))
        local = np.array([metrics[k] for k in METRICS] + [self.agreement.vote()], np.float64)
        summed = local if self.group is None else self.group.sum_floats(local)  # every rank is done
        self.agreement.count(float(summed[-1]))
        self.hooks.on_compute(time.perf_counter() - t0)
        for received in (*shares, *self.riders.pop(self.step, [])):
            inbox.applied(received)
        self.step = self.trainer.step
        values = {k: float(v) / self.world for k, v in zip(METRICS, summed)}
        self.record_step({**values, "lr": metrics["lr"]})
        self.after_step(values)
        return self.agreement.agreed_stop


class ElectraSubWorker(DiscriminatorRank):
    """Rank >= 1: trains on the shares the root scatters to ``sub-disc-<rank>``."""

    role = ROLE

    def __init__(self, settings: Settings, rank: int, transport: Transport | None = None) -> None:
        super().__init__(settings, rank, transport)
        if not 1 <= rank < self.world:
            raise WorkerError(f"sub-discriminator rank {rank} outside 1..{self.world - 1} (n_sub = {self.world})")
        self.flow = flow_named(self.flows, topology.sub_discriminator_flow(rank))
        self.ready: list[Received] = []

    def declare(self) -> None:
        self.transport.declare_flow(self.flow, "consumer")

    def open_inbox(self) -> OrderedInbox:
        # The micro_batch of a share is step * K + generator: the stream's next index.
        return OrderedInbox(self, self.flow, self.step * self.k_gen, self.window(self.k_gen))

    def next_shares(self, inbox: OrderedStreams) -> list[Received] | None:
        # Once shares are in flight the other ranks wait for this one in the
        # all-reduce, so a stop request is honoured at the step boundary (train()).
        while len(self.ready) < self.k_gen:
            received = inbox.next(0.5)
            if received is None:
                if self.stop_requested.is_set() and self.agreement.alone:
                    return None
                continue
            self.ready += inbox.take_from(0, received)  # one stream: the root's shares
        shares, self.ready = self.ready[: self.k_gen], self.ready[self.k_gen:]
        return shares


@role("electra-sub")
def main(settings: Settings, worker_index: int = 1) -> int:
    """``worker_index`` is the rank (1..n_sub-1); rank 0 is ``electra-root``."""
    worker = ElectraSubWorker(settings, worker_index)
    worker.install_signal_handlers()
    return worker.main()
