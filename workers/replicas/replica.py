"""One cluster's replica of a DiLoCo job: roles of the runtime's driver, one step per sync event.

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
and what it resends has the same bytes and message id, which receivers drop.

**Ranks.** With ``[replicas] ranks = R``, cluster ``c`` runs R processes, one gloo group (NCCL
on GPUs). Every inner step rank ``r`` takes piece ``r`` of R equal pieces of the cluster's batch
(cut along the first axis), computes its gradients, and all-reduces their mean with the other
ranks, so every rank steps its inner optimizer on the same gradient and all hold the same
weights: R ranks train what one process trains on the whole batch, up to the float rounding of
the mean. The step's stop votes and the loss ride in the same collective (``runtime.agreement``),
so the ranks stop at the same event and checkpoint together. All of that, and the model, is the
:class:`ReplicaTrainer` every rank's role is given.

Rank 0 (:class:`Replica`) alone talks across the WAN. After every event it publishes the event's
average, float32, with its members to each of its cluster's other ranks (:class:`FollowerRank`)
on ``outer-<c>-r<r>`` (the cluster's own broker: nothing more crosses the WAN), and each of them
takes the same outer step from it, so every rank of every cluster holds the same outer weights.
That flow is the other ranks' one ordered stream: exactly once, acked with the checkpoints the
group writes together. With a quorum rank 0 alone knows whether its cluster trains an event, and
tells the other ranks on the same flow (``nebula_mq.membership.words``); a rank left out goes
back to its state before it trained, as rank 0 does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from nebula_mq.errors import WorkerError
from nebula_mq.membership.quorum import MEMBERS, Members, Membership, bits, members_of
from nebula_mq.membership.words import LEFT, LIFE, SKIP, TRAIN, WORD, Told, agree_life
from nebula_mq.models.frameworks import Framework, Group, framework_of, user_code
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.checkpoint import Checkpoint
from nebula_mq.runtime.driver import Extras, StepInputs, StopCheck, drive
from nebula_mq.runtime.logs import bind_context
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from workers.base import WorkerIdentity
from workers.registry import role
from workers.replicas.exchange import RAW, START, WanExchange, check_start
from workers.replicas.job import ROLE, ReplicaSpec, load_job, rank_flow, replica_id
from workers.replicas.outer import Arrays, OuterNesterov, digest, mixed
from workers.replicas.schedule import SyncSchedule, partition
from workers.replicas.spec import load_spec
from workers.split.job import micro_batch_seed
from workers.split.shards import piece

PARAM = "model/param/"  # the model's weights in the checkpoint (the framework's names)


class ReplicaTrainer:
    """What every rank of cluster ``index``'s replica keeps and does: the model, its inner steps,
    the outer weights ``θ`` and the outer step, the cluster's group, and their checkpoint."""

    def __init__(self, settings: Settings, spec: ReplicaSpec, index: int, worker: Worker,
                 framework: Framework | None = None, rank: int = 0) -> None:
        """``worker``: of :meth:`Replica.identity` ``(settings, index, rank)``."""
        self.job = job = load_job(settings)
        if not 0 <= rank < job.ranks:
            raise WorkerError(f"rank {rank} outside 0..{job.ranks - 1} ([replicas] ranks)")
        self.settings, self.index, self.spec, self.rank, self.world = settings, index, spec, rank, job.ranks
        self.worker = worker
        self.fw = framework or framework_of(spec.model, "replicas.model", job.framework, settings.source)
        self.fw.place(settings.job.device, rank, "job.device", settings.source or "<settings>")
        self.model = self.fw.to_device(spec.model)
        self.optimizer = (spec.optimizer_fn or self.fw.default_optimizer)(self.fw.trainable(self.model), job.inner_lr)
        self.exchange_gradients = job.exchange == "gradients"
        self.schedule = SyncSchedule(job.inner_steps, job.fragments, job.overlap_steps, settings.job.steps)
        self.total = self.schedule.events  # [job] steps: rounds x fragments, or inner steps exchanging gradients
        # With a quorum the others may go on to the job's end without this cluster (quorum.py).
        self.behind = self.total if job.goes_on_without else 0
        self.start = self.weights()  # θ: the weights of the last outer steps, equal on every replica
        self.fragments = partition({k: v.size for k, v in self.start.items()}, job.fragments,
                                   settings.source or "<settings>")
        self.trained = 0  # inner steps done
        self.losses: list[float] = []  # of the inner steps since the last pseudo-gradient left
        self.busy_s = 0.0  # seconds computing since the last event applied: the next event's compute_s
        self.outer = OuterNesterov(job.outer_lr, job.outer_momentum, job.nesterov)
        self.produced = -1  # the event whose pseudo-gradient is sent and not yet applied
        self.round_values: dict[str, float] = {}
        # With a quorum a cluster left out of an event goes back to its state before it trained
        # the event (membership.quorum), until the event is applied; the coordinator never is.
        self.keeps_before = job.goes_on_without and (index != 0 or job.elected)
        self.before: Arrays = {}
        self.group: Group | None = None
        self.life = -1  # the group's, agreed when it starts (membership.words)
        if self.world > 1:  # a rank started on a host that is not its own: one line, before it connects
            job.group_address(index).bind_env(rank)

    # ------------------------------------------------------------------ the group

    def open(self, leaves_alone: Callable[[], bool] | None = None) -> None:
        """Declare the rank's flows and join the cluster's group (its agreement becomes the
        worker's; ``leaves_alone`` as ``Worker.join`` takes it)."""
        transport = self.worker.transport
        for flow in self.job.incoming(self.index, self.rank):
            transport.declare_flow(flow, "consumer")
        for flow in self.job.outgoing(self.index, self.rank):
            transport.declare_flow(flow, "producer")
        if self.world == 1:
            return
        self.group = self.fw.join_group(self.rank, self.job.group_address(self.index), self.job.group_timeout_s)
        self.worker.join(self.group, leaves_alone)
        self.life = agree_life(self.group, self.rank)

    def rank_piece(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """This rank's piece of a batch's arrays (all of them with one rank)."""
        out = [np.asarray(a) for a in arrays]
        if self.world == 1:
            return out
        for a in out:
            if a.shape[0] % self.world:
                raise WorkerError(f"a batch of {a.shape[0]} rows cannot be cut into [replicas] ranks = "
                                  f"{self.world} equal pieces: make the batch a multiple of the ranks")
        return [a[piece(a.shape[0], self.world, self.rank)] for a in out]

    # ------------------------------------------------------------------ the model

    def weights(self) -> Arrays:
        """The model's trainable weights by name, copied out of the framework."""
        arrays = self.fw.state_arrays("model", self.model, self.optimizer)
        return {k[len(PARAM):]: np.array(v, np.float32, copy=True) for k, v in arrays.items() if k.startswith(PARAM)}

    def set_weights(self, weights: Arrays) -> None:
        self.fw.load_weights("model", self.model, {PARAM + k: v for k, v in weights.items()})

    def backward(self, step: int) -> float:
        """Forward and backward of inner step ``step`` (counted over the whole job) on this
        rank's piece of its replica's shard; the loss, its mean over the cluster's ranks. The
        gradients (their mean over the ranks) wait on the parameters."""
        me = self.worker.worker_id
        with user_code(f"{me}: batch({self.index}, {step})"):
            inputs, targets = (self.rank_piece(arrays) for arrays in self.spec.batch(self.index, step))
        seed = micro_batch_seed(self.settings.job.seed, me, step)
        with self.fw.seeded(seed):
            with user_code(f"{me}: the model's forward on step {step}"):
                out = self.model(*(self.fw.tensor(a) for a in inputs))
            with user_code(f"{me}: the loss on step {step}"):
                loss = self.spec.loss(out, *(self.fw.tensor(t) for t in targets))
        with user_code(f"{me}: the backward of step {step}"):
            value = self.fw.loss_backward(loss, me)
        if self.group is None:
            return value
        (summed,) = self.worker.agreement.voted(
            partial(self.group.allreduce_gradients, self.fw.trainable(self.model), "mean"), value)
        return float(summed) / self.world

    def train_to(self, count: int) -> None:
        """The inner steps up to ``count`` done in all (none when already there)."""
        while self.trained < count:
            self.losses.append(self.backward(self.trained))
            self.fw.step(self.optimizer, None)
            self.trained += 1

    def due(self, event: int, stopping: Callable[[], bool]) -> bool:
        """Whether ``event`` is still to train and send (once an event, not past the last)."""
        return self.produced != event and event < self.total and not stopping()

    def update(self, s: int, state: Callable[[], Mapping[str, np.ndarray]] = dict) -> Arrays:
        """Event ``s``'s inner steps and what it sends: the fragment's pseudo-gradient once
        trained to ``send_at(s)`` or, exchanging gradients, inner step ``s``'s gradient. With a
        quorum the state before it (the model's and ``state()``) is kept until ``s`` is applied."""
        bind_context(step=s)
        if self.keeps_before:  # a fresh start trains event 0
            self.before = {k: np.array(v, copy=True) for k, v in {
                **self.fw.state_arrays("model", self.model, self.optimizer), **state()}.items()}
        t0 = time.perf_counter()
        if self.exchange_gradients:
            self.losses.append(self.backward(s))
            delta = self.fw.param_grads(self.model)
        else:
            self.train_to(self.schedule.send_at(s))
            now = self.weights()
            delta = {name: self.start[name] - now[name] for name in self.fragments[self.schedule.fragment(s)]}
        self.busy_s += time.perf_counter() - t0
        return delta

    def sent(self, s: int, values: Mapping[str, float]) -> None:
        """Event ``s`` is sent (``values``: what sending it cost): its losses become the
        event's, then, with overlap, the inner steps up to ``apply_at(s)``."""
        self.round_values = {"loss": float(np.mean(self.losses)), "last_inner_loss": self.losses[-1], **values}
        self.losses = []
        self.produced = s
        if not self.exchange_gradients:  # overlap: trains while the pseudo-gradient travels
            t0 = time.perf_counter()
            self.train_to(self.schedule.apply_at(s))
            self.busy_s += time.perf_counter() - t0

    def fragment(self, s: int) -> Arrays:
        """The outer weights of event ``s``'s fragment."""
        return {name: self.start[name] for name in self.fragments[self.schedule.fragment(s)]}

    def member(self, s: int, chosen: Members) -> bool:
        """Whether this cluster is among event ``s``'s members ``chosen``; a member has sent its own."""
        if (member := self.index in chosen) and self.produced != s:
            raise WorkerError(f"{self.worker.worker_id}: event {s} applied before its own pseudo-gradient was made")
        return member

    def apply(self, s: int, mean: Arrays, chosen: Members, t0: float) -> dict[str, float]:
        """Event ``s``'s average of its members ``chosen``: the outer step taken, the model
        given the result; a rank left out goes back to its state before it trained the event.
        The event's values (``t0``: when its apply began)."""
        member = self.index in chosen
        if not member and self.before:  # left out: back to its state before it trained (quorum.py)
            self.fw.load_state_arrays("model", self.model, self.optimizer, self.before)
        if self.exchange_gradients:  # synchronous data parallelism: one inner step on the mean
            self.fw.set_param_grads(self.model, mean)
            self.fw.step(self.optimizer, None)
            self.start = self.weights()
        else:
            outer = self.outer.step(self.fragment(s), mean)
            self.start.update(outer)
            last = s == self.total - 1 or not member  # all of θ after the last event
            mixing = self.job.mixing if self.schedule.overlap else 0.0
            self.set_weights(dict(self.start) if last else mixed(self.weights(), outer, mixing))
        if not member or self.exchange_gradients:  # left out: what it trained since it sent is dropped
            self.trained = self.schedule.apply_at(s)
        if not member:
            self.round_values, self.losses = {}, []
        self.produced, self.before = -1, {}
        busy, self.busy_s = self.busy_s + time.perf_counter() - t0, 0.0
        norm = float(np.sqrt(sum(float(np.square(m, dtype=np.float64).sum()) for m in mean.values())))
        return {**self.round_values, "mean_delta_norm": norm, "compute_s": busy, "members": float(len(chosen))}

    # ------------------------------------------------------------------ checkpoint

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {**self.fw.state_arrays("model", self.model, self.optimizer),
                  **{f"outer/param/{k}": v for k, v in self.start.items()}, **self.outer.state_arrays("outer/momentum"),
                  **{f"before/{k}": v for k, v in self.before.items()}}
        return arrays, {"produced": self.produced, "round_values": self.round_values, "losses": self.losses}

    def load(self, ck: Checkpoint) -> None:
        self.fw.load_state_arrays("model", self.model, self.optimizer, ck.arrays)
        self.start = {k: np.array(ck.arrays[f"outer/param/{k}"], np.float32) for k in sorted(self.start)}
        self.outer.restore(ck.arrays, "outer/momentum")
        # An event sent and not applied when the checkpoint was written: its overlap trained;
        # else the inner steps up to the last event applied.
        self.produced = ck.step if int(ck.meta.get("produced", -1)) == ck.step else -1
        self.trained = self.schedule.apply_at(ck.step if self.produced >= 0 else ck.step - 1)
        self.losses = [float(v) for v in ck.meta.get("losses", [])]
        self.round_values = {k: float(v) for k, v in dict(ck.meta.get("round_values", {})).items()}
        self.before = {k[len("before/"):]: v for k, v in ck.arrays.items() if k.startswith("before/")}


class Replica:
    """Cluster ``index``'s rank 0: its replica on the WAN, given its trainer (see the module docstring)."""

    in_flight = 2  # a peer is at most one event ahead (it waits for this replica), and one spare

    @staticmethod
    def identity(settings: Settings, index: int, rank: int = 0) -> WorkerIdentity:
        """The worker of cluster ``index``'s replica, its rank ``rank``: its cluster and id."""
        job = load_job(settings)
        if not 0 <= index < job.n:
            raise WorkerError(f"replica {index} outside 0..{job.n - 1} ([replicas] clusters)")
        return WorkerIdentity(settings, job.clusters[index], replica_id(index, rank), ROLE, job.checkpoint_every)

    def __init__(self, trainer: ReplicaTrainer) -> None:
        self.trainer, self.worker, self.job, self.index = trainer, trainer.worker, trainer.job, trainer.index
        self.total = trainer.total
        self.wan = WanExchange(self.job, self.index, self.worker)
        self.membership = Membership(self.job, self.index, self.worker.store.root, self.wan.tell)
        self.averages: list[Outbox] = []  # every event's average to the cluster's other ranks
        self.words: list[Outbox] = []  # with a quorum, whether they train each event (membership.words)

    def inputs(self) -> StepInputs:
        peers = tuple(replica_id(d) for d in self.job.peers(self.index))
        return StepInputs(self.job.incoming(self.index), peers + self.membership.sources, behind=self.trainer.behind)

    def open(self) -> None:
        self.trainer.open()
        self.wan.open()
        w, flows = self.worker, [rank_flow(self.job, self.index, r) for r in range(1, self.trainer.world)]
        self.averages = [Outbox(w, flow, w.worker_id) for flow in flows]
        if self.job.goes_on_without:
            self.words = [Outbox(w, flow, f"{w.worker_id}-{WORD}") for flow in flows]

    def close(self) -> None:
        """Close the outboxes; leaving without its group, it tells its other ranks first."""
        self.wan.close()
        w = self.worker
        if self.averages and w.stop_requested.is_set() and not w.agreement.agreed_stop:
            for r in range(1, self.trainer.world):
                said = Outbox(w, rank_flow(self.job, self.index, r), f"{w.worker_id}-{LEFT}")
                said.send(step=w.step, micro_batch=w.step, meta={LEFT: 1, LIFE: self.trainer.life})
                said.flush()
                said.close()
        for outbox in self.averages + self.words:
            outbox.close()

    def extras(self) -> Extras:
        return Extras(admit=self.membership.admit, handle_other=self.membership.handle_other, members=self.members)

    def members(self, heads: tuple[Received | None, ...]) -> tuple[bool, ...] | None:
        """The streams the event takes (quorum.py); the coordinator publishes its choice first."""
        s = self.worker.step
        chosen = self.membership.members(s, self.trainer.produced == s, heads)
        if chosen is None:
            return None
        self.wan.publish_choice(s, chosen)
        return tuple(d in chosen for d in self.job.peers(self.index)) + tuple(True for _ in self.membership.sources)

    def tell(self, event: int, said: str) -> None:
        """With a quorum: the other ranks train ``event`` (TRAIN, before this rank trains it) or
        apply it untrained (SKIP)."""
        for outbox in self.words:
            outbox.send(step=event, micro_batch=event, meta={WORD: said, LIFE: self.trainer.life})

    def produce(self, stopping: StopCheck) -> None:
        """The event's inner steps and its pseudo-gradient, sent, then its overlap; once an event,
        and not while catching up (quorum.py)."""
        t, s = self.trainer, self.worker.step
        if not t.due(s, stopping) or not self.membership.may_produce():
            return
        self.membership.produced()
        self.tell(s, TRAIN)
        delta = t.update(s, lambda: self.wan.compression.state_arrays("pseudograd"))
        t0 = time.perf_counter()
        encoded = self.wan.encode(t.schedule.outer_round(s), delta)
        t.busy_s += time.perf_counter() - t0  # sent on the publisher's I/O thread: not compute
        t.sent(s, self.wan.publish(s, encoded, delta, {"loss": float(np.mean(t.losses)), START: digest(t.start)}))

    def apply(self, parts: tuple[Received, ...]) -> dict[str, float]:
        """Event ``worker.step``: the members' pseudo-gradients of its fragment averaged, given to
        the other ranks, and the outer step taken."""
        t0 = time.perf_counter()
        t, s, chosen = self.trainer, self.worker.step, self.membership.current
        member = t.member(s, chosen)  # before the other ranks are told
        if t.produced != s:  # with a quorum: applied untrained, and the other ranks told so
            self.tell(s, SKIP)
        mine = digest(t.start)
        mean = self.wan.average(s, chosen, parts, t.fragment(s), mine)
        for outbox in self.averages:
            outbox.send(step=s, micro_batch=s, tensors={k: (np.asarray(v), RAW) for k, v in mean.items()},
                        meta={START: mine, MEMBERS: bits(chosen)})
        if not member:
            self.membership.left_out()
            if t.before:
                self.wan.compression.restore(t.before, sorted(t.start), "pseudograd")
        return t.apply(s, mean, chosen, t0)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = self.trainer.state()
        return {**arrays, **self.wan.state_arrays()}, {**meta, "catching_up": self.membership.catching_up}

    def load(self, ck: Checkpoint) -> None:
        t = self.trainer
        t.load(ck)
        sent = t.fragments[t.schedule.fragment(ck.step)] if t.produced >= 0 else ()
        self.wan.restore(ck.arrays, sorted(t.start), sent)
        self.membership.catching_up = bool(ck.meta.get("catching_up", False))


class FollowerRank:
    """Cluster ``index``'s rank ``rank`` > 0, given its trainer: it trains with its group and
    takes every event's average from its rank 0 (see the module docstring)."""

    in_flight = 2

    def __init__(self, trainer: ReplicaTrainer) -> None:
        self.trainer, self.worker, self.job, self.total = trainer, trainer.worker, trainer.job, trainer.total
        self.told = Told(needs_word=self.job.goes_on_without)

    def inputs(self) -> StepInputs:
        t = self.trainer
        return StepInputs(self.job.incoming(t.index, t.rank), (replica_id(t.index),), behind=t.behind)

    def open(self) -> None:
        # It idles while rank 0 waits on the WAN: asked to stop, it leaves alone only once rank 0
        # has (or rank 0, given the WAN's message, would enter a collective alone).
        self.trainer.open(lambda: self.told.leader_left)
        self.told.life = self.trainer.life

    def close(self) -> None:
        """Nothing to close: it sends nothing."""

    def extras(self) -> Extras:
        return Extras(admit=self.members_of, handle_other=self.told.handle_other, members=self.members)

    def members(self, heads: tuple[Received | None, ...]) -> tuple[bool, ...] | None:
        """Its one stream, rank 0's average of the event, once told what to do."""
        s = self.worker.step
        return None if heads[0] is None or not self.told.may_apply(s, self.trainer.produced == s) else (True,)

    def members_of(self, received: Received) -> Members:
        """The members an average names, checked as it arrives (malformed: a dead letter, not a
        stopped rank); every cluster when it names none (an average queued by a version before
        quorums with ranks, which had no quorum)."""
        job = self.job
        if MEMBERS not in received.meta:
            return tuple(range(job.n))
        return members_of(received.meta, job.n, job.quorum or job.n, first=not job.elected)

    def produce(self, stopping: StopCheck) -> None:
        """The event's inner steps with its group, on rank 0's word with a quorum; once an event."""
        t, s = self.trainer, self.worker.step
        if t.due(s, stopping) and self.told.may_train(s):
            t.update(s)
            t.sent(s, {"sent_bytes": 0.0, "raw_bytes": 0.0})  # rank 0 sends it across the WAN

    def apply(self, parts: tuple[Received, ...]) -> dict[str, float]:
        """Event ``worker.step``: the average its rank 0 sent, from the same outer weights, and
        the outer step taken."""
        t0 = time.perf_counter()
        t, s = self.trainer, self.worker.step
        check_start(self.worker.worker_id, s, parts, digest(t.start))
        (part,) = parts
        chosen = self.members_of(part)
        t.member(s, chosen)
        return t.apply(s, {k: np.asarray(v, np.float32) for k, v in part.tensors.items()}, chosen, t0)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return self.trainer.state()

    def load(self, ck: Checkpoint) -> None:
        self.trainer.load(ck)


def replica_role(settings: Settings, spec: ReplicaSpec, index: int, worker: Worker,
                 framework: Framework | None = None, rank: int = 0) -> Replica | FollowerRank:
    """The role of cluster ``index``'s rank ``rank``, given ``worker`` (of :meth:`Replica.identity`)."""
    trainer = ReplicaTrainer(settings, spec, index, worker, framework, rank)
    return Replica(trainer) if rank == 0 else FollowerRank(trainer)


def run_replica(settings: Settings, spec: ReplicaSpec, index: int, transport: Transport | None = None,
                rank: int = 0) -> int:
    """Train replica ``index`` (its rank ``rank``) with ``spec`` until ``[job] steps`` sync events
    (or SIGTERM), over ``transport`` (None: its cluster's RabbitMQ broker); exit code."""
    identity = Replica.identity(settings, index, rank)
    worker = identity.worker(transport) if transport is not None else identity.broker_worker()
    return drive(worker, replica_role(settings, spec, index, worker, rank=rank))


@role(ROLE)
def main(settings: Settings, worker_index: int = 0) -> int:
    """``nebula-mq worker --role replica --index I``: cluster ``I // ranks``'s rank ``I % ranks``
    (the plan's index); the spec comes from ``[replicas] model``."""
    c, rank = divmod(worker_index, load_job(settings).ranks)
    return run_replica(settings, load_spec(settings, c), c, rank=rank)
