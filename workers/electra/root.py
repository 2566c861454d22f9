"""ELECTRA root discriminator (cluster B, rank 0): scatter, train its share, sync with G.

From ``gen-results`` (or, with a process per generator, from every
``gen-results-<k>``, one inbox each) it takes each generator's micro-batches in
order (the runtime's :class:`OrderedStreams`, one counter per generator). Share 0 of a step is its own;
share ``r`` is forwarded to ``sub-disc-r`` as ``micro_batch = step * K + k``,
keeping its content. A forwarded delivery is recorded and acked with the step
it belongs to (not when forwarded): after a group restart from step ``c``,
everything of later steps is still on ``gen-results`` and is re-scattered with
the same ids, so a rank that lost its copy gets it again and one that holds it
drops the repeat.

After every step (all ranks done, see ``workers.electra.sub``) the root sends the sync
token ``step = steps done, micro_batch = step index`` to every generator process.
"""

from __future__ import annotations

import numpy as np

from nebula_mq import topology
from nebula_mq.codecs import LZ4
from nebula_mq.errors import MalformedMessage
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.logs import get_logger
from nebula_mq.runtime.ordered import OrderedStreams
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from workers.electra.flows import flow_named, results_flows, sync_flows
from workers.electra.sub import DiscriminatorRank
from workers.registry import role

log = get_logger(__name__)

ROLE = "electra-root"


class ElectraRootWorker(DiscriminatorRank):
    role = ROLE

    def __init__(self, settings: Settings, transport: Transport | None = None) -> None:
        super().__init__(settings, 0, transport)
        self.results_flows = [flow_named(self.flows, name) for name in results_flows(self.job)]
        self.sync_flows = [flow_named(self.flows, name) for name in sync_flows(self.job)]
        self.sub_flows = [flow_named(self.flows, topology.sub_discriminator_flow(r)) for r in range(1, self.world)]
        self.own: dict[int, dict[int, Received]] = {}  # step -> generator -> its share-0 message

    def declare(self) -> None:
        for flow in self.results_flows:
            self.transport.declare_flow(flow, "consumer")
        for flow in self.sync_flows:
            self.transport.declare_flow(flow, "producer")
        for flow in self.sub_flows:
            self.transport.declare_flow(flow, "producer")

    def open_inbox(self) -> OrderedStreams:
        # One message per rank and step, per generator: micro_batch = step * n_sub + share.
        n, window = self.world, self.window(self.world)
        per_flow = self.k_gen // len(self.results_flows)  # generators publishing on each
        return OrderedStreams(self, self.results_flows, self.k_gen, self.step * n, window,
                              held=window.held * per_flow)

    def open(self) -> None:
        super().open()
        self.sync_out = [Outbox(self, f, self.worker_id) for f in self.sync_flows]
        self.sub_out = [Outbox(self, f, self.worker_id) for f in self.sub_flows]

    def close(self) -> None:
        for outbox in (*self.sync_out, *self.sub_out):
            outbox.close()

    def _generator_of(self, received: Received) -> int:
        k = received.meta.get("generator")
        step, share = divmod(received.micro_batch, self.world)
        if not isinstance(k, int) or not 0 <= k < self.k_gen or received.envelope.step != step \
                or received.meta.get("share") != share:
            raise MalformedMessage(f"generator {k!r}, step {received.envelope.step}, share "
                                   f"{received.meta.get('share')!r} do not fit micro-batch {received.micro_batch}")
        own = self.results_flows[k if len(self.results_flows) > 1 else 0].name
        if received.envelope.flow != own:  # a process per generator: k publishes on its own flow only
            raise MalformedMessage(f"generator {k}'s micro-batch on flow {received.envelope.flow!r}, not {own!r}")
        return k

    def _scattered(self, step: int) -> bool:
        """Every share of ``step`` is here or forwarded: only then may this rank enter the
        step's all-reduce (a sub waiting for a share the root still holds would deadlock it)."""
        return (len(self.own.get(step, {})) == self.k_gen
                and len(self.riders.get(step, [])) == (self.world - 1) * self.k_gen)

    def next_shares(self, inbox: OrderedStreams) -> list[Received] | None:
        while not self._scattered(self.step):
            received = inbox.next(0.5)
            if received is None:
                if self.stop_requested.is_set() and self.agreement.alone:
                    return None
                continue
            try:
                k = self._generator_of(received)
            except MalformedMessage as exc:
                inbox.reject(received, exc)
                continue
            for ready in inbox.take_from(k, received):
                self.route(k, ready)
        own = self.own.pop(self.step)
        return [own[k] for k in range(self.k_gen)]

    def route(self, k: int, received: Received) -> None:
        step, share = divmod(received.micro_batch, self.world)
        if share == 0:
            self.own.setdefault(step, {})[k] = received
            return
        self.sub_out[share - 1].send(step=step, micro_batch=step * self.k_gen + k,
                                     tensors={n: (a, LZ4()) for n, a in received.tensors.items()},
                                     meta=dict(received.meta))
        self.riders.setdefault(step, []).append(received)

    def after_step(self, metrics: dict[str, float]) -> None:
        for outbox in self.sync_out:
            outbox.send(step=self.step, micro_batch=self.step - 1,
                        tensors={}, meta=metrics)  # the token is its step (envelope) and the metrics


@role("electra-root")
def main(settings: Settings, worker_index: int = 0) -> int:
    worker = ElectraRootWorker(settings)
    worker.install_signal_handlers()
    return worker.main()


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
