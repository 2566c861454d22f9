"""ELECTRA root discriminator (cluster B, rank 0): scatter, train its share, sync with G.

From ``gen-results`` (or, with a process per generator, from every
``gen-results-<k>``, one inbox each) a step is the ``n_sub`` micro-batches of the
step from each generator, in order: one stream per generator producer, each on its
own counter (``micro_batch = step * n_sub + share``; the runtime's driver orders
them). Share 0 of each generator is the root's own; share ``r`` is forwarded to
``sub-disc-r`` as ``micro_batch = step * K + k``, keeping its content, when the
step is applied, before the root enters the step's all-reduce (a sub waiting for a
share the root still holds would deadlock it). Every micro-batch of a step is acked
with the checkpoint that holds the step, forwarded or not: after a group restart
from step ``c``, everything of later steps is still on ``gen-results`` and is
re-scattered with the same ids, so a rank that lost its copy gets it again and one
that holds it drops the repeat.

After every step (all ranks done, see ``workers.electra.sub``) the root sends the sync
token ``step = steps done, micro_batch = step index`` to every generator process,
before the checkpoint that holds the step.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from nebula_mq.codecs import LZ4
from nebula_mq.errors import MalformedMessage
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.driver import Extras, StepInputs, drive
from nebula_mq.runtime.logs import get_logger
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from workers.electra.common import ROOT_ROLE, generator_id
from workers.electra.flows import flow_named, results_flows, sub_discriminator_flow, sync_flows
from workers.electra.sub import DiscriminatorRank
from workers.registry import role

log = get_logger(__name__)



class ElectraRoot(DiscriminatorRank):
    """Rank 0: reads every generator's stream, scatters the other ranks' shares, trains on
    its own and sends the sync tokens."""

    role = ROOT_ROLE

    def __init__(self, settings: Settings, worker: Worker) -> None:
        """``worker``: of ``ElectraRoot.identity(settings, 0)``."""
        super().__init__(settings, worker, 0)
        self.results_flows = [flow_named(self.flows, name) for name in results_flows(self.job)]
        self.sync_flows = [flow_named(self.flows, name) for name in sync_flows(self.job)]
        self.sub_flows = [flow_named(self.flows, sub_discriminator_flow(r)) for r in range(1, self.world)]
        self.sync_out: list[Outbox] = []
        self.sub_out: list[Outbox] = []

    def inputs(self) -> StepInputs:
        # A stream per generator (its producer id), n_sub micro-batches of it a step.
        return StepInputs(self.results_flows, tuple(generator_id(k) for k in range(self.k_gen)), self.world)

    def extras(self) -> Extras:
        return replace(super().extras(), admit=self.check_share)

    def declare(self) -> None:
        transport = self.worker.transport
        for flow in self.results_flows:
            transport.declare_flow(flow, "consumer")
        for flow in (*self.sync_flows, *self.sub_flows):
            transport.declare_flow(flow, "producer")
        self.sync_out = [Outbox(self.worker, f, self.worker.worker_id) for f in self.sync_flows]
        self.sub_out = [Outbox(self.worker, f, self.worker.worker_id) for f in self.sub_flows]

    def close(self) -> None:
        for outbox in (*self.sync_out, *self.sub_out):
            outbox.close()

    def check_share(self, received: Received) -> None:
        """A micro-batch says who made it and which share of which step it is, consistently
        with its producer and index; a generator publishes on its own flow only."""
        k = received.meta.get("generator")
        step, share = divmod(received.micro_batch, self.world)
        if not isinstance(k, int) or not 0 <= k < self.k_gen or received.envelope.producer != generator_id(k) \
                or received.envelope.step != step or received.meta.get("share") != share:
            raise MalformedMessage(f"generator {k!r} (producer {received.envelope.producer!r}), step "
                                   f"{received.envelope.step}, share {received.meta.get('share')!r} do not fit "
                                   f"micro-batch {received.micro_batch}")
        own = self.results_flows[k if len(self.results_flows) > 1 else 0].name
        if received.envelope.flow != own:  # a process per generator: k publishes on its own flow only
            raise MalformedMessage(f"generator {k}'s micro-batch on flow {received.envelope.flow!r}, not {own!r}")

    def apply(self, parts: tuple[Received, ...]) -> dict[str, float]:
        """Step ``worker.step``: ``parts`` holds each generator's n_sub shares in order. Forward
        shares 1.. to their ranks, train on share 0 of every generator, send the sync token."""
        n, step = self.world, self.worker.step
        own = []
        for k in range(self.k_gen):
            mine = parts[k * n:(k + 1) * n]
            own.append(mine[0])
            for outbox, received in zip(self.sub_out, mine[1:]):
                outbox.send(step=step, micro_batch=step * self.k_gen + k,
                            tensors={name: (a, LZ4()) for name, a in received.tensors.items()},
                            meta=dict(received.meta))
        values = self.train(own)
        metrics = {k: v for k, v in values.items() if k != "lr"}
        for outbox in self.sync_out:  # the token is its step (envelope) and the metrics
            outbox.send(step=step + 1, micro_batch=step, tensors={}, meta=metrics)
        return values


@role(ROOT_ROLE)
def main(settings: Settings, worker_index: int = 0) -> int:
    worker = ElectraRoot.identity(settings, 0).broker_worker()
    return drive(worker, ElectraRoot(settings, worker))


def evaluate(settings: Settings) -> dict[str, float]:
    """Held-out MLM accuracy of each generator and RTD / CLM accuracy of the discriminator,
    from the job's latest checkpoints (the held-out sentences were never trained on).
    The discriminator is scored on held-out micro-batches corrupted by its generator."""
    import dataclasses

    from nebula_mq.errors import CheckpointError
    from nebula_mq.models.electra_trainers import DiscriminatorTrainer, GeneratorTrainer
    from nebula_mq.runtime.checkpoint import CheckpointStore
    from workers.electra.common import PADDLE_TURN, generator_worker_id
    from workers.electra.job import load_job
    from workers.electra.data import load_streams

    job = load_job(settings)
    cfg, streams = load_streams(settings, job)
    root = settings.run_dir / "checkpoints"
    latest = [CheckpointStore(root / generator_worker_id(job, k)).latest() for k in range(len(streams))]
    gen_cks = [ck for ck in latest if ck is not None]
    disc_ck = CheckpointStore(root / "disc-root").latest()
    if len(gen_cks) != len(latest) or disc_ck is None:
        raise CheckpointError(f"no generator or root checkpoint under {root}")
    out: dict[str, float] = {"gen_step": float(min(ck.step for ck in gen_cks)), "disc_step": float(disc_ck.step)}
    with PADDLE_TURN:
        disc = DiscriminatorTrainer(dataclasses.replace(cfg, init="random"))  # the checkpoint overwrites it
        disc.load_state_arrays(disc_ck.arrays)
        for k, (stream, gen_ck) in enumerate(zip(streams, gen_cks)):
            gen = GeneratorTrainer(cfg, k)
            prefix = f"g{k}/"
            gen.load_state_arrays({a[len(prefix):]: v for a, v in gen_ck.arrays.items() if a.startswith(prefix)})
            inputs = [gen.build_inputs(b) for b in stream.heldout_batches()]
            out.update({f"g{k}_heldout_{m}": v for m, v in gen.evaluate(inputs).items()})
            corrupted = [gen.corrupt_without_training(ids, seed=1000 + i)[0] for i, ids in enumerate(inputs)]
            scores = disc.evaluate(corrupted)
            out.update({f"g{k}_heldout_{m}": v for m, v in scores.items()})
            # Baseline: a detector that calls every token original.
            att = np.concatenate([c["attention_mask"].ravel() for c in corrupted]).astype(bool)
            rep = np.concatenate([c["replaced"].ravel() for c in corrupted]).astype(bool)
            out[f"g{k}_heldout_rtd_all_original_acc"] = float((~rep[att]).mean())
    return out
