"""One cluster's replica of a DiLoCo job: a role of the runtime's driver, one step per outer round.

Round ``r`` (the worker's step ``r``) of replica ``c``:

1. :meth:`Replica.produce` (once per round, before the driver waits): ``inner_steps`` steps
   of the inner optimizer on the replica's own data (``batch(c, r * H + h)``, dropout seeded
   by (job seed, replica, inner step)), then the pseudo-gradient ``Δ_c = θ − θ_c``, encoded
   once (``workers.replicas.compression``) and published as micro-batch ``r`` to every other
   cluster;
2. the driver's inbox gathers round ``r``'s pseudo-gradient of every other replica (one
   ordered stream each: repeats dropped, nothing applied twice);
3. :meth:`Replica.apply`: the average of the decoded pseudo-gradients in cluster order, its
   own included as decoded, and the outer step (``workers.replicas.outer``); the model and
   ``θ`` take the result, and the inner optimizer keeps its state (DiLoCo).

Every replica starts from the same weights (the spec builds the same model everywhere) and
applies the same float32 operations to the same numbers, so all hold bit-identical weights
after every outer step. The checkpoint holds ``θ``, the outer momentum, the model and the
inner optimizer, the error-feedback residual and, when the round's inner steps are done and
sent but not yet applied, their decoded pseudo-gradient (``produced``): a resumed replica
neither retrains nor resends a round its checkpoint covers, and one that resends (a round
after its checkpoint) sends the same bytes under the same message id, which receivers drop.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nebula_mq.errors import WorkerError
from nebula_mq.models.frameworks import Framework, framework_of
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.checkpoint import Checkpoint
from nebula_mq.runtime.driver import StepInputs, StopCheck, drive
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from workers.base import role_worker
from workers.registry import role
from workers.replicas.compression import PseudoGradientCompression
from workers.replicas.job import ROLE, ReplicaSpec, load_job, load_spec, replica_id
from workers.replicas.outer import Arrays, OuterNesterov, average
from workers.split.job import micro_batch_seed

log = get_logger(__name__)

PARAM = "model/param/"  # the model's weights in the checkpoint (the framework's names)
START = "start"  # the meta key of a pseudo-gradient's message: the digest of the weights it started from


def digest(weights: Mapping[str, np.ndarray]) -> str:
    """A short digest of named weights: equal for bit-identical weights."""
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode() + b"\0" + np.ascontiguousarray(weights[name], np.float32).tobytes())
    return h.hexdigest()[:32]


class Replica:
    """Cluster ``index``'s replica (see the module docstring)."""

    def __init__(self, settings: Settings, spec: ReplicaSpec, index: int, transport: Transport | None = None,
                 framework: Framework | None = None) -> None:
        self.job = job = load_job(settings)
        if not 0 <= index < job.n:
            raise WorkerError(f"replica {index} outside 0..{job.n - 1} ([replicas] clusters)")
        self.settings, self.index, self.spec = settings, index, spec
        self.worker = role_worker(settings, job.clusters[index], replica_id(index), ROLE, transport,
                                  checkpoint_every=job.checkpoint_every)
        self.fw = framework or framework_of(spec.model, "replicas.model", job.framework)
        self.fw.place(settings.job.device, 0, "job.device")
        self.model = self.fw.to_device(spec.model)
        self.optimizer = (spec.optimizer_fn or self.fw.default_optimizer)(self.fw.trainable(self.model), job.inner_lr)
        self.total = settings.job.steps  # outer rounds
        self.in_flight = 2  # a peer is at most one round ahead (it waits for this replica), and one spare
        self.sources = tuple(replica_id(d) for d in job.peers(index))
        self.start = self.weights()  # θ: the weights of the last outer step, equal on every replica
        self.outer = OuterNesterov(job.outer_lr, job.outer_momentum, job.nesterov)
        self.compression = PseudoGradientCompression(job.codec, job.error_feedback, settings.codec.allow_non_finite)
        self.produced = -1  # the round whose pseudo-gradient is sent and not yet applied
        self.own: Arrays = {}  # that round's pseudo-gradient as every receiver decodes it
        self.round_values: dict[str, float] = {}
        self.outboxes: list[Outbox] = []

    # ------------------------------------------------------------------ the model

    def weights(self) -> Arrays:
        """The model's trainable weights by name, copied out of the framework."""
        arrays = self.fw.state_arrays("model", self.model, self.optimizer)
        return {k[len(PARAM):]: np.array(v, np.float32, copy=True) for k, v in arrays.items() if k.startswith(PARAM)}

    def set_weights(self, weights: Arrays) -> None:
        self.fw.load_weights("model", self.model, {PARAM + k: v for k, v in weights.items()})

    def inner_step(self, step: int) -> float:
        """Inner step ``step`` (counted over all rounds) on this replica's shard; its loss."""
        inputs, targets = self.spec.batch(self.index, step)
        seed = micro_batch_seed(self.settings.job.seed, f"replica-{self.index}", step)
        with self.fw.seeded(seed):
            out = self.model(*(self.fw.tensor(np.asarray(a)) for a in inputs))
            loss = self.spec.loss(out, *(self.fw.tensor(np.asarray(t)) for t in targets))
        value = self.fw.loss_backward(loss, self.worker.worker_id)
        self.fw.step(self.optimizer, None)
        return value

    # ------------------------------------------------------------------ the role (runtime.driver)

    def inputs(self) -> StepInputs:
        return StepInputs(self.job.incoming(self.index), self.sources)

    def open(self) -> None:
        transport = self.worker.transport
        for flow in self.job.incoming(self.index):
            transport.declare_flow(flow, "consumer")
        for flow in self.job.outgoing(self.index):
            transport.declare_flow(flow, "producer")
        self.outboxes = [Outbox(self.worker, flow, self.worker.worker_id) for flow in self.job.outgoing(self.index)]

    def close(self) -> None:
        for outbox in self.outboxes:
            outbox.close()

    def produce(self, stopping: StopCheck) -> None:
        """The inner steps of the worker's round and its pseudo-gradient, sent; once a round."""
        r = self.worker.step
        if self.produced == r or r >= self.total or stopping():
            return
        bind_context(step=r)
        t0 = time.perf_counter()
        h = self.job.inner_steps
        losses = [self.inner_step(r * h + k) for k in range(h)]
        current = self.weights()
        delta = {name: self.start[name] - current[name] for name in self.start}
        encoded, self.own = self.compression.encode(r, delta)
        self.worker.hooks.on_compute(time.perf_counter() - t0)
        for outbox in self.outboxes:
            outbox.send(step=r, micro_batch=r, encoded=encoded,
                        meta={"loss": float(np.mean(losses)), START: digest(self.start)})
        wire = sum(enc.nbytes for _, enc in encoded.values())
        self.round_values = {"loss": float(np.mean(losses)), "last_inner_loss": losses[-1],
                             "sent_bytes": float(wire * len(self.outboxes)),
                             "raw_bytes": float(sum(d.nbytes for d in delta.values()) * len(self.outboxes))}
        self.produced = r

    def apply(self, parts: tuple[Received, ...]) -> dict[str, float]:
        """Round ``worker.step``: every replica's pseudo-gradient averaged, the outer step taken."""
        r = self.worker.step
        if self.produced != r:
            raise WorkerError(f"{self.worker.worker_id}: round {r} applied before its own pseudo-gradient was made")
        t0 = time.perf_counter()
        mine = digest(self.start)
        for p in parts:
            if p.meta.get(START) != mine:
                raise WorkerError(f"{self.worker.worker_id}: round {r}: {p.envelope.producer} started from other "
                                  "weights than this replica (the model must be built the same on every cluster)")
        received = iter(self.compression.decode(p.tensors, self.start) for p in parts)  # peers, in cluster order
        deltas: Sequence[Arrays] = [self.own if d == self.index else next(received) for d in range(self.job.n)]
        mean = average(deltas)
        self.start = self.outer.step(self.start, mean)
        self.set_weights(self.start)
        self.produced, self.own = -1, {}
        self.worker.hooks.on_compute(time.perf_counter() - t0)
        norm = float(np.sqrt(sum(float(np.square(m, dtype=np.float64).sum()) for m in mean.values())))
        return {**self.round_values, "mean_delta_norm": norm}

    # ------------------------------------------------------------------ checkpoint

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = self.fw.state_arrays("model", self.model, self.optimizer)
        arrays.update({f"outer/param/{k}": v for k, v in self.start.items()})
        arrays.update(self.outer.state_arrays("outer/momentum"))
        arrays.update(self.compression.state_arrays("pseudograd"))
        arrays.update({f"own/{k}": v for k, v in self.own.items()})
        return arrays, {"produced": self.produced, "round_values": self.round_values}

    def load(self, ck: Checkpoint) -> None:
        self.fw.load_state_arrays("model", self.model, self.optimizer, ck.arrays)
        names = sorted(self.start)
        self.start = {k: np.array(ck.arrays[f"outer/param/{k}"], np.float32) for k in names}
        self.outer.restore(ck.arrays, "outer/momentum")
        self.compression.restore(ck.arrays, names, "pseudograd")
        # A round sent and not applied when the checkpoint was written: its own pseudo-gradient.
        self.produced = ck.step if int(ck.meta.get("produced", -1)) == ck.step else -1
        self.own = {k: np.array(ck.arrays[f"own/{k}"], np.float32) for k in names} if self.produced >= 0 else {}
        self.round_values = {k: float(v) for k, v in dict(ck.meta.get("round_values", {})).items()}


def run_replica(settings: Settings, spec: ReplicaSpec, index: int, transport: Transport | None = None) -> int:
    """Train replica ``index`` with ``spec`` until ``[job] steps`` outer rounds (or SIGTERM); exit code."""
    replica = Replica(settings, spec, index, transport)
    return drive(replica.worker, replica)


@role(ROLE)
def main(settings: Settings, worker_index: int = 0) -> int:
    """``nebula-mq worker --role replica --index C``: the spec comes from ``[replicas] model``."""
    return run_replica(settings, load_spec(settings, worker_index), worker_index)
