"""ELECTRA generator (cluster A): mask, sample, publish; never ahead by more than max_lead.

A process hosts every generator of the job (worker ``gen``, flows
``gen-results`` / ``sync``) or, in the M3 layout with a cluster per generator,
generator ``k`` alone (worker ``gen-<k>``, flows ``gen-results-<k>`` /
``sync-<k>``; see ``workers.electra.flows``). The protocol is the same.

Each training step every hosted generator ``k`` makes ``n_sub`` micro-batches, one per
discriminator rank, and publishes each (confirmed) on its results flow as
producer ``gen-k`` with ``micro_batch = step * n_sub + share``; then it applies
its optimiser step. Masking and sampling are seeded by (seed, generator, step,
micro-batch) and there is no dropout, so a restarted generator recomputes
byte-identical micro-batches with the same ids: the root discards the repeats.

Sync protocol (paper §3.3): after each discriminator step the root sends a sync
token ``(step = steps done, micro_batch = step index)`` on each sync flow. The
generator is a role of the runtime's driver (``nebula_mq.runtime.driver``) whose
steps are the sync tokens: token ``i`` is step ``i``, applied in order on the
worker's step counter (the synced steps; a repeat is below it) and acked with the
checkpoint that records it (replay contract). Before each wait the generator
trains (:meth:`ElectraGenerator.produce`) while ``trained - synced <= max_lead``
(``max_lead = 0`` is the paper's strict lockstep; a lead that spans the tokens' round
trip, in the discriminator's steps, hides the WAN), so it never trains past the last
step, and both sides end at the same step once the last token is applied. The lead
changes no weight: a generator trains on its own data alone.

The checkpoint at synced step ``s`` holds the trainers after ``trained >= s``
steps and ``trained`` in its metadata: every micro-batch of those steps is
confirmed on the broker, so a restarted generator trains on from ``trained``.
The history has a row per synced step: the generator's values of that step (kept
until its token comes, in the checkpoint too), the synced count when it was
trained, and the discriminator's values the token brings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nebula_mq.codecs import LZ4
from nebula_mq.errors import WorkerError
from nebula_mq.models.device import use_device
from nebula_mq.models.electra_trainers import GeneratorTrainer
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.checkpoint import Checkpoint, CheckpointStore
from nebula_mq.runtime.driver import Extras, StepInputs, StopCheck, drive
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from workers.base import WorkerIdentity
from workers.electra.common import GENERATOR_ROLE, PADDLE_TURN, generator_id, generator_worker_id
from workers.electra.data import load_streams
from workers.electra.flows import electra_results_flow, electra_sync_flow, flow_named, flows
from workers.electra.job import load_job
from workers.registry import role

log = get_logger(__name__)

# Of the discriminator's values a sync token brings, those the generator's history records.
DISC_VALUES = ("rtd_loss", "rtd_acc")


class ElectraGenerator:
    """The generator process's role: trains ahead of the sync tokens, applies the tokens."""

    @staticmethod
    def identity(settings: Settings, index: int = 0) -> WorkerIdentity:
        """The worker of the process hosting generator ``index`` (of every generator when one
        process hosts them all): its cluster and id."""
        job = load_job(settings)
        slot = index if job.process_per_generator else None
        if slot is not None and not 0 <= slot < len(job.generator_clusters):
            raise WorkerError(f"generator {index} outside 0..{len(job.generator_clusters) - 1}")
        return WorkerIdentity(settings, job.cluster_of(slot or 0), generator_worker_id(job, slot or 0), GENERATOR_ROLE,
                              job.checkpoint_every)

    def __init__(self, settings: Settings, worker: Worker, index: int = 0) -> None:
        """``worker``: of ``identity(settings, index)``; ``index``: the generator this process
        hosts in the process-per-generator layout (ignored when one process hosts them all)."""
        self.job = load_job(settings)
        slot = index if self.job.process_per_generator else None
        self.worker = worker
        use_device(settings.job.device, slot or 0, "job.device", settings.source or "<settings>")
        self.cfg, self.streams = load_streams(settings, self.job)
        # The generators this process hosts (indices into cfg.generators).
        self.hosted = tuple(range(len(self.cfg.generators))) if slot is None else (slot,)
        with PADDLE_TURN:
            self.trainers = [GeneratorTrainer(self.cfg, k) for k in self.hosted]
        all_flows = flows(self.job)
        self.results_flow = flow_named(all_flows, electra_results_flow(slot))
        self.sync_flow = flow_named(all_flows, electra_sync_flow(slot))
        self.n = self.job.n
        self.total = settings.job.steps
        # One sync token a step: the root runs up to max_lead steps (and the one in flight, and
        # the last) ahead of the synced step; the driver adds what this process produced after
        # its last checkpoint before a crash (the root trained on it and sent its tokens).
        self.in_flight = self.job.max_lead + 2
        self.trained = 0  # training steps done; every micro-batch of them is published
        # The values of each trained step whose token has not come yet (by step index).
        self.unsynced: dict[int, dict[str, float]] = {}
        self.hot_start = False  # restored from another job's checkpoint (resume_store)
        self.outboxes: dict[int, Outbox] = {}

    # ------------------------------------------------------------------ checkpoint

    def extras(self) -> Extras:
        return Extras(resume_store=self.resume_store, unsaved=self.unsaved)

    def resume_store(self) -> CheckpointStore:
        """This process's store, or with none of its checkpoints and ``init_from`` set, that
        job's: a generator of its own may hot-start from a job whose one process hosted them
        all (its arrays are prefixed by generator index either way)."""
        worker = self.worker
        if worker.store.steps() or not self.job.init_from:
            return worker.store
        for source in dict.fromkeys((worker.worker_id, "gen")):
            store = CheckpointStore(Path(self.job.init_from) / "checkpoints" / source)
            if store.steps():
                self.hot_start = True
                log.info("hot_start", source=str(store.root))
                return store
        return worker.store

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        with PADDLE_TURN:
            arrays = {f"g{k}/{n}": v for k, t in zip(self.hosted, self.trainers) for n, v in t.state_arrays().items()}
        return arrays, {"trained": self.trained, "unsynced": {str(s): v for s, v in self.unsynced.items()}}

    def load(self, ck: Checkpoint) -> None:
        """The trainers and the trained count of ``ck``; a hot start (a new job: fresh queues)
        takes its sync tokens from the step trained on."""
        for k, trainer in zip(self.hosted, self.trainers):
            prefix = f"g{k}/"
            with PADDLE_TURN:
                trainer.load_state_arrays({a[len(prefix):]: v for a, v in ck.arrays.items() if a.startswith(prefix)})
        self.trained = int(ck.meta.get("trained", ck.step))
        self.unsynced = {int(s): dict(v) for s, v in ck.meta.get("unsynced", {}).items()}
        if self.hot_start:
            self.unsynced = {}
            self.worker.resume_at(self.trained)

    def unsaved(self) -> bool:
        return self.trained > 0  # published micro-batches are confirmed: remember them

    # ------------------------------------------------------------------ the role (runtime.driver)

    def inputs(self) -> StepInputs:
        return StepInputs((self.sync_flow,))

    def open(self) -> None:
        transport = self.worker.transport
        transport.declare_flow(self.results_flow, "producer")
        transport.declare_flow(self.sync_flow, "consumer")
        self.outboxes = {k: Outbox(self.worker, self.results_flow, generator_id(k)) for k in self.hosted}

    def close(self) -> None:
        for outbox in self.outboxes.values():
            outbox.close()

    def produce(self, stopping: StopCheck) -> None:
        """Train while the discriminator is at most ``max_lead`` steps behind."""
        while (self.trained < self.total and self.trained - self.worker.step <= self.job.max_lead
               and not stopping()):
            self.train_step()

    def apply(self, parts: tuple[Received, ...]) -> dict[str, float]:
        """The sync token of step ``worker.step``: the values of that training step and the
        discriminator's values the token brings."""
        token, = parts
        disc = {f"disc_{k}": float(v) for k, v in token.meta.items() if k in DISC_VALUES and isinstance(v, (int, float))}
        return {**self.unsynced.pop(self.worker.step, {}), **disc}

    def train_step(self) -> None:
        """Training step ``trained`` of every hosted generator: its n_sub micro-batches each,
        published, then the optimiser steps."""
        s = self.trained
        bind_context(step=s)
        sums: dict[str, float] = {}
        for share in range(self.n):
            mb = s * self.n + share
            for k, trainer in zip(self.hosted, self.trainers):
                ids = trainer.build_inputs(self.streams[k].batch(mb))
                with PADDLE_TURN:
                    batch, metrics = trainer.make_micro_batch(ids)
                for name, value in metrics.items():
                    sums[name] = sums.get(name, 0.0) + float(value)
                self.outboxes[k].send(step=s, micro_batch=mb, tensors={n: (a, LZ4()) for n, a in batch.items()},
                                      meta={"generator": k, "share": share})
        for trainer in self.trainers:
            with PADDLE_TURN:
                trainer.apply_update()
        self.trained = self.trainers[0].step
        count = float(self.n * len(self.trainers))
        self.unsynced[s] = {**{k: v / count for k, v in sums.items()}, "synced": float(self.worker.step)}


@role(GENERATOR_ROLE)
def main(settings: Settings, worker_index: int = 0) -> int:
    """``worker_index``: the generator, when each has a process of its own (else unused)."""
    worker = ElectraGenerator.identity(settings, worker_index).broker_worker()
    return drive(worker, ElectraGenerator(settings, worker, worker_index))
