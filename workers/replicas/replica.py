"""One cluster's replica of a DiLoCo job: a role of the runtime's driver, one step per sync event.

With one fragment (the default) a sync event is an outer round; with several, one fragment's
outer step (``workers.replicas.schedule``: Streaming DiLoCo). Event ``s`` of replica ``c``:

1. :meth:`Replica.produce` (once per event, before the driver waits): the inner steps on the
   replica's own data up to ``send_at(s)`` (inner step ``t`` draws ``batch(c, t)``, dropout
   seeded by (job seed, replica, t)), then the fragment's pseudo-gradient ``Δ_c = θ − θ_c``,
   encoded once (``workers.replicas.compression``) and published as micro-batch ``s`` to every
   other cluster; then, with overlap, the inner steps up to ``apply_at(s)``;
2. the driver's inbox gathers event ``s``'s pseudo-gradient of every other replica (one
   ordered stream each: repeats dropped, nothing applied twice) or, with a quorum, of the
   event's members (``nebula_mq.membership.quorum``: who they are, and how a cluster left out
   catches up);
3. :meth:`Replica.apply`: the average of the members' decoded pseudo-gradients in cluster
   order, its own included as decoded, and the fragment's outer step
   (``workers.replicas.outer``); ``θ`` takes the result and so does the model (mixed with its
   own weights after overlap); the inner optimizer keeps its state (DiLoCo).

Every replica starts from the same weights and applies the same float32 operations to the
same numbers, so all hold bit-identical outer weights ``θ`` after every event, and end with
every model at ``θ``. The checkpoint holds ``θ``, the outer momentum, the model, the inner
optimizer, the error-feedback residual and, for an event sent but not applied, its decoded
pseudo-gradient: a resumed replica neither retrains nor resends what its checkpoint covers,
and what it resends has the same bytes and message id, which receivers drop. With ranks
(``workers.replicas.ranks``) rank 0 alone talks across the WAN and tells the others.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from nebula_mq.errors import WorkerError
from nebula_mq.membership.quorum import Membership
from nebula_mq.models.frameworks import Framework, framework_of, user_code
from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.checkpoint import Checkpoint
from nebula_mq.runtime.driver import Extras, StepInputs, StopCheck, drive
from nebula_mq.runtime.logs import bind_context
from nebula_mq.runtime.ordered import OrderedInbox
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from workers.base import WorkerIdentity
from workers.registry import role
from workers.replicas.compression import PseudoGradientCompression
from workers.replicas.exchange import START, WanExchange
from workers.replicas.job import ROLE, ReplicaSpec, load_job, replica_id
from workers.replicas.spec import load_spec
from workers.replicas.outer import Arrays, OuterNesterov, digest, mixed
from workers.replicas.ranks import SKIP, TRAIN, ClusterRanks
from workers.replicas.schedule import SyncSchedule, partition
from workers.split.job import micro_batch_seed

PARAM = "model/param/"  # the model's weights in the checkpoint (the framework's names)


class Replica:
    """Cluster ``index``'s replica, its rank ``rank`` (see the module docstring)."""

    @staticmethod
    def identity(settings: Settings, index: int, rank: int = 0) -> WorkerIdentity:
        """The worker of cluster ``index``'s replica, its rank ``rank``: its cluster and id."""
        job = load_job(settings)
        if not 0 <= index < job.n:
            raise WorkerError(f"replica {index} outside 0..{job.n - 1} ([replicas] clusters)")
        return WorkerIdentity(settings, job.clusters[index], replica_id(index, rank), ROLE, job.checkpoint_every)

    def __init__(self, settings: Settings, spec: ReplicaSpec, index: int, worker: Worker,
                 framework: Framework | None = None, rank: int = 0) -> None:
        """``worker``: of ``identity(settings, index, rank)``."""
        self.job = job = load_job(settings)
        self.settings, self.index, self.spec, self.rank = settings, index, spec, rank
        self.worker = worker
        self.fw = framework or framework_of(spec.model, "replicas.model", job.framework, settings.source)
        self.fw.place(settings.job.device, rank, "job.device", settings.source or "<settings>")
        self.ranks = ClusterRanks(job, index, rank, self.fw)
        self.model = self.fw.to_device(spec.model)
        self.optimizer = (spec.optimizer_fn or self.fw.default_optimizer)(self.fw.trainable(self.model), job.inner_lr)
        self.exchange_gradients = job.exchange == "gradients"
        self.schedule = SyncSchedule(job.inner_steps, job.fragments, job.overlap_steps, settings.job.steps)
        self.total = self.schedule.events  # [job] steps: rounds x fragments, or inner steps exchanging gradients
        self.in_flight = 2  # a peer is at most one event ahead (it waits for this replica), and one spare
        self.sources = tuple(replica_id(d) for d in job.peers(index)) if rank == 0 else (self.ranks.source,)
        self.start = self.weights()  # θ: the weights of the last outer steps, equal on every replica
        self.fragments = partition({k: v.size for k, v in self.start.items()}, job.fragments,
                                   settings.source or "<settings>")
        self.trained = 0  # inner steps done
        self.losses: list[float] = []  # of the inner steps since the last pseudo-gradient left
        self.busy_s = 0.0  # seconds computing since the last event applied: the next event's compute_s
        self.outer = OuterNesterov(job.outer_lr, job.outer_momentum, job.nesterov)
        compression = PseudoGradientCompression(job.codec, job.error_feedback, settings.codec.allow_non_finite)
        self.wan = WanExchange(job, index, self.worker, compression)  # rank 0's
        self.produced = -1  # the event whose pseudo-gradient is sent and not yet applied
        self.round_values: dict[str, float] = {}
        self.membership = Membership(job, index, self.worker.store.root, self.wan.tell if rank == 0 else None)
        self.before: Arrays = {}  # a follower's state before it trained the event (quorum.py), until applied

    # ------------------------------------------------------------------ the model

    def weights(self) -> Arrays:
        """The model's trainable weights by name, copied out of the framework."""
        arrays = self.fw.state_arrays("model", self.model, self.optimizer)
        return {k[len(PARAM):]: np.array(v, np.float32, copy=True) for k, v in arrays.items() if k.startswith(PARAM)}

    def set_weights(self, weights: Arrays) -> None:
        self.fw.load_weights("model", self.model, {PARAM + k: v for k, v in weights.items()})

    def backward(self, step: int) -> float:
        """Forward and backward of inner step ``step`` (counted over the whole job) on this
        replica's shard; its loss. The gradients wait on the parameters."""
        me = self.worker.worker_id
        with user_code(f"{me}: batch({self.index}, {step})"):
            inputs, targets = (self.ranks.piece(arrays) for arrays in self.spec.batch(self.index, step))
        seed = micro_batch_seed(self.settings.job.seed, me, step)
        with self.fw.seeded(seed):
            with user_code(f"{me}: the model's forward on step {step}"):
                out = self.model(*(self.fw.tensor(a) for a in inputs))
            with user_code(f"{me}: the loss on step {step}"):
                loss = self.spec.loss(out, *(self.fw.tensor(t) for t in targets))
        with user_code(f"{me}: the backward of step {step}"):
            value = self.fw.loss_backward(loss, me)
        return self.ranks.reduce(self.model, value, self.worker.agreement)  # the cluster's mean

    def inner_step(self, step: int) -> float:
        """Inner step ``step`` of the inner optimizer; its loss."""
        value = self.backward(step)
        self.fw.step(self.optimizer, None)
        return value

    def update(self, s: int) -> Arrays:
        """What event ``s`` sends: the fragment's pseudo-gradient once trained to ``send_at(s)``
        or, exchanging gradients, inner step ``s``'s gradient (its step waits for the others')."""
        if self.exchange_gradients:
            self.losses.append(self.backward(s))
            return self.fw.param_grads(self.model)
        self.train_to(self.schedule.send_at(s))
        now = self.weights()
        return {name: self.start[name] - now[name] for name in self.fragments[self.schedule.fragment(s)]}

    # ------------------------------------------------------------------ the role (runtime.driver)

    def inputs(self) -> StepInputs:
        choices = self.membership.sources if self.rank == 0 else ()  # rank 0 gives the others each event
        return StepInputs(self.job.incoming(self.index, self.rank), self.sources + choices)

    def open(self) -> None:
        transport = self.worker.transport
        for flow in self.job.incoming(self.index, self.rank):
            transport.declare_flow(flow, "consumer")
        for flow in self.job.outgoing(self.index, self.rank):
            transport.declare_flow(flow, "producer")
        if self.rank == 0:
            self.wan.open()
        self.ranks.open(self.worker)

    def close(self) -> None:
        self.wan.close()
        self.ranks.close(self.worker)

    def extras(self) -> Extras:
        return Extras(admit=self.admit, handle_other=self.handle_other, members=self.members,
                      left_behind=self.left_behind)

    def handle_other(self, inbox: OrderedInbox, received: Received) -> bool:
        if self.rank > 0:
            return self.ranks.handle_other(self.worker, inbox, received)
        return self.membership.handle_other(inbox, received)  # the election's messages

    def admit(self, received: Received) -> None:
        if self.rank == 0:
            self.membership.admit(received)
        else:
            self.ranks.admit(received)

    def left_behind(self) -> int:
        """With a quorum the others may go on to the job's end without this replica (quorum.py)."""
        return self.total if self.membership.active else 0

    def members(self, heads: tuple[Received | None, ...]) -> tuple[bool, ...] | None:
        """The streams the event takes (quorum.py); the coordinator publishes its choice first."""
        s = self.worker.step
        if self.rank > 0:  # its one stream: rank 0's average of the event, once told what to do
            return None if heads[0] is None or not self.ranks.may_apply(s, self.produced == s) else (True,)
        chosen = self.membership.members(s, self.produced == s, heads)
        if chosen is None:
            return None
        self.wan.publish_choice(s, chosen)
        return tuple(d in chosen for d in self.job.peers(self.index)) + tuple(True for _ in self.membership.sources)

    def train_to(self, count: int) -> None:
        """The inner steps up to ``count`` done in all (none when already there)."""
        while self.trained < count:
            self.losses.append(self.inner_step(self.trained))
            self.trained += 1

    def produce(self, stopping: StopCheck) -> None:
        """The event's inner steps and its pseudo-gradient, sent, then its overlap; once an event."""
        s = self.worker.step
        # Rank 0 trains it unless catching up (quorum.py), another rank on its word (ranks.py).
        may_train = self.membership.may_produce() if self.rank == 0 else self.ranks.may_train(s)
        if self.produced == s or s >= self.total or stopping() or not may_train:
            return
        self.membership.produced()
        self.ranks.tell(s, TRAIN)  # rank 0 with a quorum: the other ranks train it with it
        bind_context(step=s)
        if self.membership.active and not self.membership.coordinator:  # a fresh start trains event 0
            self.before = {k: np.array(v, copy=True) for k, v in {
                **self.fw.state_arrays("model", self.model, self.optimizer),
                **self.wan.compression.state_arrays("pseudograd")}.items()}
        t0 = time.perf_counter()
        delta = self.update(s)
        encoded = self.wan.encode(self.schedule.outer_round(s), delta) if self.rank == 0 else {}
        self.computed(time.perf_counter() - t0)
        loss = float(np.mean(self.losses))  # sent on the publisher's I/O thread: not compute
        sent = self.wan.publish(s, encoded, delta, {"loss": loss, START: digest(self.start)})
        self.round_values = {"loss": loss, "last_inner_loss": self.losses[-1], **sent}
        self.losses = []
        self.produced = s
        if not self.exchange_gradients:  # overlap: trains while the pseudo-gradient travels
            t1 = time.perf_counter()
            self.train_to(self.schedule.apply_at(s))
            self.computed(time.perf_counter() - t1)

    def computed(self, seconds: float) -> None:
        """Wall clock computing, the event's ``compute_s`` (the driver's times of ``produce``
        and ``apply`` are the worker's compute metric)."""
        self.busy_s += seconds

    def apply(self, parts: tuple[Received, ...]) -> dict[str, float]:
        """Event ``worker.step``: every replica's pseudo-gradient of its fragment averaged, the
        outer step taken, the model given the result."""
        t0 = time.perf_counter()
        s, mine = self.worker.step, digest(self.start)
        like = {name: self.start[name] for name in self.fragments[self.schedule.fragment(s)]}
        if self.rank > 0:
            mean, chosen = self.ranks.received(self.worker.worker_id, s, parts, mine)
        else:
            chosen = self.membership.current
        if (member := self.index in chosen) and self.produced != s:  # before the other ranks are told
            raise WorkerError(f"{self.worker.worker_id}: event {s} applied before its own pseudo-gradient was made")
        if self.rank == 0:
            if self.produced != s:  # with a quorum: applied untrained, and the other ranks told so
                self.ranks.tell(s, SKIP)
            mean = self.wan.average(s, chosen, parts, like, mine)
            self.ranks.share(s, mean, chosen, {START: mine})
        if not member and self.before:  # left out: back to its state before it trained (quorum.py)
            self.fw.load_state_arrays("model", self.model, self.optimizer, self.before)
            self.wan.compression.restore(self.before, sorted(self.start), "pseudograd")
        if self.exchange_gradients:  # synchronous data parallelism: one inner step on the mean
            self.fw.set_param_grads(self.model, mean)
            self.fw.step(self.optimizer, None)
            self.start = self.weights()
        else:
            outer = self.outer.step(like, mean)
            self.start.update(outer)
            self.set_weights(self.landed(outer, last=s == self.total - 1 or not member))
        if not member or self.exchange_gradients:  # left out: what it trained since it sent is dropped
            self.trained = self.schedule.apply_at(s)
        if not member:
            self.membership.left_out()
            self.round_values, self.losses = {}, []
        self.produced, self.wan.own, self.before = -1, {}, {}
        self.computed(time.perf_counter() - t0)
        busy, self.busy_s = self.busy_s, 0.0
        norm = float(np.sqrt(sum(float(np.square(m, dtype=np.float64).sum()) for m in mean.values())))
        return {**self.round_values, "mean_delta_norm": norm, "compute_s": busy, "members": float(len(chosen))}

    def landed(self, outer: Arrays, last: bool) -> Arrays:
        """The model's weights once ``outer`` lands (``mixed``); all of ``θ`` after the last event."""
        mixing = self.job.mixing if self.schedule.overlap else 0.0
        return dict(self.start) if last else mixed(self.weights(), outer, mixing)

    # ------------------------------------------------------------------ checkpoint

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {**self.fw.state_arrays("model", self.model, self.optimizer),
                  **{f"outer/param/{k}": v for k, v in self.start.items()}, **self.outer.state_arrays("outer/momentum"),
                  **self.wan.state_arrays(), **{f"before/{k}": v for k, v in self.before.items()}}
        return arrays, {"produced": self.produced, "round_values": self.round_values, "losses": self.losses,
                        "catching_up": self.membership.catching_up}

    def load(self, ck: Checkpoint) -> None:
        self.fw.load_state_arrays("model", self.model, self.optimizer, ck.arrays)
        names = sorted(self.start)
        self.start = {k: np.array(ck.arrays[f"outer/param/{k}"], np.float32) for k in names}
        self.outer.restore(ck.arrays, "outer/momentum")
        # An event sent and not applied when the checkpoint was written: its own pseudo-gradient,
        # and its overlap trained; else the inner steps up to the last event applied.
        self.produced = ck.step if int(ck.meta.get("produced", -1)) == ck.step else -1
        sent = self.fragments[self.schedule.fragment(ck.step)] if self.produced >= 0 else ()
        self.wan.restore(ck.arrays, names, sent)
        self.trained = self.schedule.apply_at(ck.step if self.produced >= 0 else ck.step - 1)
        self.losses = [float(v) for v in ck.meta.get("losses", [])]
        self.round_values = {k: float(v) for k, v in dict(ck.meta.get("round_values", {})).items()}
        self.membership.catching_up = bool(ck.meta.get("catching_up", False))
        self.before = {k[len("before/"):]: v for k, v in ck.arrays.items() if k.startswith("before/")}


def run_replica(settings: Settings, spec: ReplicaSpec, index: int, transport: Transport | None = None,
                rank: int = 0) -> int:
    """Train replica ``index`` (its rank ``rank``) with ``spec`` until ``[job] steps`` sync events
    (or SIGTERM), over ``transport`` (None: its cluster's RabbitMQ broker); exit code."""
    identity = Replica.identity(settings, index, rank)
    worker = identity.worker(transport) if transport is not None else identity.broker_worker()
    return drive(worker, Replica(settings, spec, index, worker, rank=rank))


@role(ROLE)
def main(settings: Settings, worker_index: int = 0) -> int:
    """``nebula-mq worker --role replica --index I``: cluster ``I // ranks``'s rank ``I % ranks``
    (the plan's index); the spec comes from ``[replicas] model``."""
    c, rank = divmod(worker_index, load_job(settings).ranks)
    return run_replica(settings, load_spec(settings, c), c, rank=rank)
