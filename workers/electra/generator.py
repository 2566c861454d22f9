"""ELECTRA generator worker (cluster A): mask, sample, publish; never ahead by more than max_lead.

A process hosts every generator of the job (worker ``gen``, flows
``gen-results`` / ``sync``) or, in the M3 layout with a cluster per generator,
generator ``k`` alone (worker ``gen-<k>``, flows ``gen-results-<k>`` /
``sync-<k>``; see ``workers.electra.flows``). The protocol is the same.

Each step every hosted generator ``k`` makes ``n_sub`` micro-batches, one per
discriminator rank, and publishes each (confirmed) on its results flow as
producer ``gen-k`` with ``micro_batch = step * n_sub + share``; then it applies
its optimiser step. Masking and sampling are seeded by (seed, generator, step,
micro-batch) and there is no dropout, so a restarted generator recomputes
byte-identical micro-batches with the same ids: the root discards the repeats.

Sync protocol (paper §3.3): after each discriminator step the root sends a sync
token ``(step = steps done, micro_batch = step index)`` on each sync flow. The
generator starts step ``s`` only when ``s - synced <= max_lead`` (``max_lead = 0``
is the paper's strict lockstep; 1-2 hide the WAN latency), and finishes only
when ``synced == steps``: both sides end at the same step. Tokens are applied in
order on one counter, ``synced`` (a repeat is below it), and acked with the
checkpoint that records it (replay contract).
"""

from __future__ import annotations

import time
from pathlib import Path

from nebula_mq.codecs import LZ4
from nebula_mq.models.electra_trainers import GeneratorTrainer
from nebula_mq.models.device import use_device
from nebula_mq.runtime.channel import Outbox
from nebula_mq.runtime.ordered import FlowWindow, OrderedInbox
from nebula_mq.runtime.checkpoint import Checkpoint, CheckpointStore
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.loop import LoopWorker
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from nebula_mq import topology
from nebula_mq.errors import WorkerError
from workers.base import RoleWorker
from workers.electra.common import PADDLE_TURN, generator_id, generator_worker_id
from workers.electra.data import load_streams
from workers.electra.flows import flow_named, flows
from workers.electra.job import load_job
from workers.registry import role

log = get_logger(__name__)

ROLE = "electra-generator"


class ElectraGeneratorWorker(LoopWorker[OrderedInbox], RoleWorker):
    role = ROLE

    def __init__(self, settings: Settings, transport: Transport | None = None, index: int = 0) -> None:
        """``index``: the generator this process hosts in the process-per-generator layout
        (ignored when one process hosts them all)."""
        self.job = load_job(settings)
        slot = index if self.job.process_per_generator else None
        if slot is not None and not 0 <= slot < len(self.job.generator_clusters):
            raise WorkerError(f"generator {index} outside 0..{len(self.job.generator_clusters) - 1}")
        super().__init__(settings, self.job.cluster_of(slot or 0), generator_worker_id(self.job, slot or 0),
                         transport, checkpoint_every=self.job.checkpoint_every)
        use_device(settings.job.device, slot or 0)
        self.cfg, self.streams = load_streams(settings, self.job)
        # The generators this process hosts (indices into cfg.generators).
        self.hosted = tuple(range(len(self.cfg.generators))) if slot is None else (slot,)
        with PADDLE_TURN:
            self.trainers = [GeneratorTrainer(self.cfg, k) for k in self.hosted]
        all_flows = flows(self.job)
        self.results_flow = flow_named(all_flows, topology.electra_results_flow(slot))
        self.sync_flow = flow_named(all_flows, topology.electra_sync_flow(slot))
        self.n = self.job.n
        self.synced = 0  # discriminator steps done, from the newest sync token
        self.disc_values: dict[str, float] = {}
        self.total = settings.job.steps

    # ------------------------------------------------------------------ checkpoint

    def restore(self) -> None:
        ck, hot = self.store.latest(), False
        if ck is None and self.job.init_from:
            # A generator of its own may hot-start from a job whose one process hosted them all
            # (its arrays are prefixed by generator index either way).
            for source in dict.fromkeys((self.worker_id, "gen")):
                ck, hot = CheckpointStore(Path(self.job.init_from) / "checkpoints" / source).latest(), True
                if ck is not None:
                    break
        if ck is None:
            return
        self.load(ck)
        if hot:  # a new job: fresh queues, its sync tokens start at this step
            self.synced = self.step
        log.info("resumed", step=self.step, synced=self.synced, hot_start=hot)

    def load(self, ck: Checkpoint) -> None:
        for k, trainer in zip(self.hosted, self.trainers):
            prefix = f"g{k}/"
            with PADDLE_TURN:
                trainer.load_state_arrays({a[len(prefix):]: v for a, v in ck.arrays.items() if a.startswith(prefix)})
        self.step = ck.step
        self.synced = int(ck.meta["synced"])

    def checkpoint(self) -> None:
        with PADDLE_TURN:
            arrays = {f"g{k}/{n}": v for k, t in zip(self.hosted, self.trainers) for n, v in t.state_arrays().items()}
        self.commit(arrays, {"synced": self.synced})
        self.write_history()

    # ------------------------------------------------------------------ loop

    def open(self) -> None:
        self.transport.declare_flow(self.results_flow, "producer")
        self.transport.declare_flow(self.sync_flow, "consumer")
        self.outboxes = {k: Outbox(self, self.results_flow, generator_id(k)) for k in self.hosted}

    def close(self) -> None:
        for outbox in self.outboxes.values():
            outbox.close()

    def open_inbox(self) -> OrderedInbox:
        # One sync token a step: the root runs up to max_lead steps (and the one in flight, and
        # the last) ahead of ``synced``, plus what this process produced after its last
        # checkpoint before a crash (the root trained on it and sent its tokens).
        window = FlowWindow(ahead=self.job.max_lead + 2 + self.checkpoint_every, unacked=self.checkpoint_every)
        # Token i (micro_batch i) says step i + 1 is done: the next one to apply is ``synced``.
        return OrderedInbox(self, self.sync_flow, self.synced, window)

    def advance(self, inbox: OrderedInbox) -> bool:
        """One step, once the discriminator is at most ``max_lead`` steps behind."""
        while self.step - self.synced > self.job.max_lead and not self.stop_requested.is_set():
            self.poll_sync(inbox, 0.5)
        if self.stop_requested.is_set():
            return False
        self.train_step(self.outboxes)
        while self.poll_sync(inbox, 0):
            pass
        if self.step % self.checkpoint_every == 0:
            self.checkpoint()
        return True

    def finish(self, inbox: OrderedInbox) -> None:
        """Both sides end at the same step: wait for the last sync token."""
        while self.synced < self.step and not self.stop_requested.is_set():
            self.poll_sync(inbox, 0.5)

    def needs_final_checkpoint(self) -> bool:
        return (self.step > 0 and not self.has_checkpoint_at_step()) or bool(self._pending_acks)

    def poll_sync(self, inbox: OrderedInbox, timeout: float) -> bool:
        """Apply the sync tokens whose turn has come; False when nothing came within ``timeout``."""
        received = inbox.next(timeout)
        if received is None:
            return False
        for token in inbox.take(received):
            self.synced = int(token.envelope.step)
            self.disc_values = {k: float(v) for k, v in token.meta.items() if isinstance(v, (int, float))}
            inbox.applied(token)
        return True

    def train_step(self, outboxes: dict[int, Outbox]) -> None:
        s = self.step
        bind_context(step=s)
        t0 = time.perf_counter()
        sums: dict[str, float] = {}
        for share in range(self.n):
            mb = s * self.n + share
            for k, trainer in zip(self.hosted, self.trainers):
                ids = trainer.build_inputs(self.streams[k].batch(mb))
                with PADDLE_TURN:
                    batch, metrics = trainer.make_micro_batch(ids)
                for name, value in metrics.items():
                    sums[name] = sums.get(name, 0.0) + value
                self.hooks.on_compute(time.perf_counter() - t0)
                outboxes[k].send(step=s, micro_batch=mb, tensors={n: (a, LZ4()) for n, a in batch.items()},
                                 meta={"generator": k, "share": share})
                t0 = time.perf_counter()
        for trainer in self.trainers:
            with PADDLE_TURN:
                trainer.apply_update()
        self.hooks.on_compute(time.perf_counter() - t0)
        self.step = self.trainers[0].step
        count = float(self.n * len(self.trainers))
        self.record_step({**{k: v / count for k, v in sums.items()}, "synced": float(self.synced),
                          **{f"disc_{k}": v for k, v in self.disc_values.items() if k in ("rtd_loss", "rtd_acc")}})


@role("electra-generator")
def main(settings: Settings, worker_index: int = 0) -> int:
    """``worker_index``: the generator, when each has a process of its own (else unused)."""
    worker = ElectraGeneratorWorker(settings, index=worker_index)
    worker.install_signal_handlers()
    return worker.main()
