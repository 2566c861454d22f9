"""The ``[replicas]`` section and what a replicas job is: one full replica of a user's model per
cluster, synchronised every ``inner_steps`` by an outer step (DiLoCo).

Cluster ``c`` (``clusters[c]``) runs the worker ``replica-<c>``; its pseudo-gradient goes to
every other cluster ``d`` on the flow ``pseudograd-<c>-<d>`` (one flow per ordered pair of
clusters, federated like every cross-cluster flow). The order of ``clusters`` is the order in
which every replica sums the pseudo-gradients, so it is part of the job.

What the user supplies is a :class:`ReplicaSpec`, made by the function ``[replicas] model``
names (``module:function``, with ``module`` next to the job file or in ``model_dir``). This
module imports no framework: the launcher reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nebula_mq import config, topology
from nebula_mq.config import PATH, InvalidField
from nebula_mq.membership.election import FLOW as ELECTION_FLOW
from nebula_mq.models.frameworks import FRAMEWORKS
from nebula_mq.models.group_address import GroupAddress
from nebula_mq.settings import Settings
from nebula_mq.stack.layout import did_you_mean

# batch(shard, step) -> (inputs, targets): the arrays of inner step ``step`` of the replica
# training on shard ``shard`` (its cluster's index); deterministic in both.
BatchFn = Callable[[int, int], tuple[Sequence[np.ndarray], Sequence[np.ndarray]]]
# loss(model output, *targets as tensors) -> scalar tensor (the model's framework).
LossFn = Callable[..., Any]
# optimizer_fn(trainable parameters, lr) -> the inner optimizer, of the model's framework.
OptimizerFn = Callable[[list[Any], float], Any]

ROLE = "replica"
EXCHANGES = ("weights", "gradients")
COORDINATORS = ("first", "elected")


@dataclass(frozen=True)
class ReplicaSpec:
    """A user's whole model on one cluster: ``loss(model(*inputs), *targets)`` on ``batch``."""

    model: Any  # a paddle.nn.Layer or a torch.nn.Module, built the same on every cluster
    loss: LossFn
    batch: BatchFn
    optimizer_fn: OptimizerFn | None = None  # None: Adam at [replicas] inner_lr


@dataclass(frozen=True)
class ReplicasJob:
    """DiLoCo across clusters: a full replica per cluster, an outer Nesterov step every
    ``inner_steps`` on the average of every cluster's compressed pseudo-gradient."""

    # One replica per cluster, in the order every replica sums the pseudo-gradients.
    clusters: tuple[str, ...] = ("cluster-a", "cluster-b")
    # Inner optimizer steps between two outer steps (DiLoCo's H). [job] steps counts sync events:
    # outer rounds x fragments (one event per round with one fragment).
    inner_steps: int = 10
    # Learning rate handed to the inner optimizer (Adam unless the model's spec gives one).
    inner_lr: float = 3e-3
    # The outer step's learning rate (DiLoCo: 0.7).
    outer_lr: float = 0.7
    # The outer step's momentum (DiLoCo: 0.9); 0 = plain averaging scaled by outer_lr.
    outer_momentum: float = 0.9
    # Nesterov momentum, as torch.optim.SGD(nesterov=True); false = heavy-ball momentum.
    nesterov: bool = True
    # Codec chain of every pseudo-gradient, e.g. "int8", "int4", "none".
    codec: str = "int8"
    # Carry what the codec dropped from a pseudo-gradient into the same cluster's next one.
    error_feedback: bool = True
    # "module:function" returning a ReplicaSpec from (settings, cluster index).
    model: str = ""
    # Where model's module is, relative to the job file ("" = next to the job file).
    model_dir: str = field(default="", metadata=PATH)
    # The model's framework, "paddle" or "torch"; "" = whichever the model is.
    framework: str = ""
    # What the clusters exchange: "weights" (DiLoCo: every inner_steps, each replica's change of
    # weights, then the outer step) or "gradients" (synchronous data parallelism, the baseline
    # DiLoCo is measured against: every inner step's gradient, then the inner optimizer on their
    # mean; needs inner_steps = 1, fragments = 1 and overlap_steps = 0).
    exchange: str = "weights"
    # Sync the model in this many fragments, one every inner_steps / fragments inner steps
    # (Streaming DiLoCo); 1 = every parameter at once. Must divide inner_steps.
    fragments: int = 1
    # Inner steps trained after a fragment is sent and before its outer step is applied, so
    # the wire's round trip hides behind compute (Streaming DiLoCo's tau); at most
    # inner_steps / fragments. 0 = wait for the other clusters before training on.
    overlap_steps: int = 0
    # With overlap_steps > 0: the share of its own weights a fragment keeps when its late
    # outer step lands (Streaming DiLoCo's alpha); without overlap a replica takes the outer weights.
    mixing: float = 0.5
    # Sync events between checkpoints (and at the last); one event per round when fragments = 1.
    checkpoint_every: int = 5
    # Clusters a sync event needs to go on, the first cluster (the coordinator) counted; 0 =
    # every cluster (wait for a cluster that is away). Below that, a cluster whose update has
    # not come within quorum_wait_s is left out of the event, and catches up from the
    # queues when it is back (nebula_mq.membership.quorum).
    quorum: int = 0
    # With a quorum: seconds the coordinator waits for a missing cluster's pseudo-gradient,
    # from when its own is sent, before the event goes on without it.
    quorum_wait_s: float = 30.0
    # With a quorum: who chooses each event's members. "first": the first cluster alone (the
    # others wait while it is away); "elected": any cluster, agreed by a majority of the
    # clusters (Paxos), so the job goes on while the one choosing is away. "elected" needs three
    # clusters or more, and a majority of them there.
    coordinator: str = "first"
    # With coordinator = "elected": seconds a cluster waits for an event's choice, from when its
    # own pseudo-gradient is sent, before it elects the next cluster. Above quorum_wait_s.
    coordinator_wait_s: float = 90.0
    # Data-parallel ranks of each cluster's replica: every inner step's batch is cut into this
    # many equal pieces and the ranks all-reduce their gradients (gloo on CPUs, NCCL on GPUs);
    # rank 0 alone talks across the WAN and gives every event's average to the others.
    ranks: int = 1
    # The host of every rank of a cluster whose ranks all run on one host (a cluster hosts does
    # not name).
    gloo_host: str = "127.0.0.1"
    # The host of each rank of a cluster whose ranks span several of its hosts, in rank order:
    # [replicas.hosts] cluster-a = ["a1", "a2"] puts cluster-a's rank r on its r-th host (a name
    # or address the cluster's other hosts reach), and its group meets on the first.
    hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Cluster c's group meets on gloo_port + c * (ranks + 1), and its rank r listens on the port
    # after that plus r, so the clusters of a local stack never share a port. Keep the ports
    # below the kernel's ephemeral range (Linux: 32768-60999).
    gloo_port: int = 29400
    # A collective (or the rendezvous) that has not completed after this long means a rank is
    # gone: the rank exits, and the cluster's ranks restart from their last common checkpoint.
    group_timeout_s: float = 300.0

    def validate(self) -> None:
        from nebula_mq.codecs import parse_codec
        from nebula_mq.errors import CodecError

        if len(self.clusters) < 2 or len(set(self.clusters)) != len(self.clusters):
            raise InvalidField("clusters", "two or more distinct cluster names", list(self.clusters))
        if self.inner_steps < 1:
            raise InvalidField("inner_steps", "an integer >= 1", self.inner_steps)
        for name in ("inner_lr", "outer_lr"):
            if not getattr(self, name) > 0:
                raise InvalidField(name, "a number > 0", getattr(self, name))
        if not 0 <= self.outer_momentum < 1:
            raise InvalidField("outer_momentum", "a number in [0, 1)", self.outer_momentum)
        try:
            parse_codec(self.codec)
        except CodecError as exc:
            raise InvalidField("codec", f"a codec chain like 'int8' ({exc})", self.codec) from None
        if self.framework not in ("", *FRAMEWORKS):
            raise InvalidField("framework", f"one of {list(FRAMEWORKS)} or empty", self.framework)
        if self.fragments < 1 or self.inner_steps % self.fragments:
            raise InvalidField("fragments", f"an integer >= 1 that divides inner_steps ({self.inner_steps})",
                               self.fragments)
        if not 0 <= self.overlap_steps <= self.inner_steps // self.fragments:
            raise InvalidField("overlap_steps", f"an integer in [0, inner_steps / fragments = "
                               f"{self.inner_steps // self.fragments}]", self.overlap_steps)
        if not 0 <= self.mixing < 1:
            raise InvalidField("mixing", "a number in [0, 1)", self.mixing)
        if self.exchange not in EXCHANGES:
            raise InvalidField("exchange", f"one of {list(EXCHANGES)}", self.exchange)
        if self.exchange == "gradients" and (self.inner_steps, self.fragments, self.overlap_steps) != (1, 1, 0):
            raise InvalidField("exchange", "\"weights\" unless inner_steps = 1, fragments = 1 and overlap_steps = 0 "
                               "(synchronous data parallelism exchanges every step's gradient)", self.exchange)
        if self.checkpoint_every < 1:
            raise InvalidField("checkpoint_every", "an integer >= 1", self.checkpoint_every)
        if not 0 <= self.quorum <= self.n:
            raise InvalidField("quorum", f"an integer in [1, {self.n}] (the clusters), or 0 for all", self.quorum)
        if not self.quorum_wait_s > 0:
            raise InvalidField("quorum_wait_s", "a number of seconds > 0", self.quorum_wait_s)
        self.validate_coordinator()
        if self.ranks < 1:
            raise InvalidField("ranks", "an integer >= 1", self.ranks)
        self.validate_hosts()
        if not 0 < self.gloo_port < 65536 - self.n * (self.ranks + 1):
            raise InvalidField("gloo_port", "a TCP port that leaves room for every cluster's ranks", self.gloo_port)
        if not self.group_timeout_s > 0:
            raise InvalidField("group_timeout_s", "a number of seconds > 0", self.group_timeout_s)

    def validate_coordinator(self) -> None:
        if self.coordinator not in COORDINATORS:
            raise InvalidField("coordinator", f"one of {list(COORDINATORS)}"
                               f"{did_you_mean(self.coordinator, COORDINATORS)}", self.coordinator)
        if not self.elected:
            return
        if self.n < 3 or not self.goes_on_without:
            raise InvalidField("coordinator", "\"first\" unless there are three clusters or more and a quorum below "
                               "all of them (with two, the one left cannot tell a cut from a death)", self.coordinator)
        if not self.coordinator_wait_s > self.quorum_wait_s:
            raise InvalidField("coordinator_wait_s", f"a number of seconds above quorum_wait_s "
                               f"({self.quorum_wait_s:g})", self.coordinator_wait_s)

    def validate_hosts(self) -> None:
        for cluster, hosts in self.hosts.items():
            if cluster not in self.clusters:
                raise InvalidField(f"hosts.{cluster}", f"a cluster of the job ({', '.join(self.clusters)})"
                                   f"{did_you_mean(cluster, self.clusters)}", cluster)
            if len(hosts) != self.ranks:
                raise InvalidField(f"hosts.{cluster}", f"one host per rank (ranks = {self.ranks})", list(hosts))
            if any(not h.strip() or ":" in h for h in hosts):
                raise InvalidField(f"hosts.{cluster}", "host names or addresses, without ports", list(hosts))

    @property
    def n(self) -> int:
        return len(self.clusters)

    def peers(self, c: int) -> tuple[int, ...]:
        """Every other replica's index, in cluster order."""
        return tuple(d for d in range(self.n) if d != c)

    @property
    def elected(self) -> bool:
        """Whether every event's members are agreed by election (nebula_mq.membership.election)."""
        return self.coordinator == "elected"

    @property
    def goes_on_without(self) -> bool:
        """Whether an event may go on without a cluster (a quorum below every cluster)."""
        return 0 < self.quorum < self.n

    @property
    def first_chooses(self) -> bool:
        """Whether the first cluster alone chooses every event's members (nebula_mq.membership.quorum)."""
        return self.goes_on_without and not self.elected

    def flows(self) -> tuple[topology.Flow, ...]:
        """One flow per ordered pair of clusters, by sender then receiver; with a quorum, the
        coordinator's choices to every other cluster."""
        return tuple(f for c in range(self.n) for f in self.outgoing(c))

    def outgoing(self, c: int, rank: int = 0) -> tuple[topology.Flow, ...]:
        """What cluster ``c``'s rank ``rank`` publishes: rank 0 its pseudo-gradients, the
        coordinator's choices and every event's average to its cluster's other ranks."""
        if rank > 0:
            return ()
        choices = tuple(quorum_flow(self, d) for d in self.peers(c)) if c == 0 and self.first_chooses else ()
        choices += tuple(elect_flow(self, c, d) for d in self.peers(c)) if self.elected else ()
        locals_ = tuple(rank_flow(self, c, r) for r in range(1, self.ranks))
        return tuple(pseudograd_flow(self, c, d) for d in self.peers(c)) + choices + locals_

    def incoming(self, c: int, rank: int = 0) -> tuple[topology.Flow, ...]:
        if rank > 0:
            return (rank_flow(self, c, rank),)
        choices: tuple[topology.Flow, ...] = (quorum_flow(self, c),) if c != 0 and self.first_chooses else ()
        choices += tuple(elect_flow(self, d, c) for d in self.peers(c)) if self.elected else ()
        return tuple(pseudograd_flow(self, d, c) for d in self.peers(c)) + choices

    def group_address(self, c: int) -> GroupAddress:
        """Where cluster ``c``'s ranks meet (``models.group_address``)."""
        hosts = self.hosts.get(self.clusters[c]) or (self.gloo_host,) * self.ranks
        return GroupAddress.on_hosts(hosts, self.gloo_port + c * (self.ranks + 1))


def replica_id(c: int, rank: int = 0) -> str:
    """The worker id of cluster ``c``'s replica (its rank ``rank``): names its checkpoints, logs
    and identity."""
    return f"replica-{c}" if rank == 0 else f"replica-{c}-r{rank}"


def rank_flow(job: ReplicasJob, c: int, rank: int) -> topology.Flow:
    """Cluster ``c``'s rank 0 to its rank ``rank``: every event's average, inside the cluster."""
    return topology.Flow(f"outer-{c}-r{rank}", job.clusters[c], job.clusters[c])


def pseudograd_flow(job: ReplicasJob, src: int, dst: int) -> topology.Flow:
    """Replica ``src``'s pseudo-gradients to replica ``dst``."""
    return topology.Flow(f"pseudograd-{src}-{dst}", job.clusters[src], job.clusters[dst])


def quorum_flow(job: ReplicasJob, dst: int) -> topology.Flow:
    """The coordinator's (cluster 0's) choice of each event's members, to replica ``dst``."""
    return topology.Flow(f"quorum-0-{dst}", job.clusters[0], job.clusters[dst])


def elect_flow(job: ReplicasJob, src: int, dst: int) -> topology.Flow:
    """Replica ``src``'s election messages to replica ``dst`` (nebula_mq.membership.election)."""
    return topology.Flow(ELECTION_FLOW.format(src=src, dst=dst), job.clusters[src], job.clusters[dst])


def load_job(settings: Settings) -> ReplicasJob:
    return config.build(ReplicasJob, dict(settings.section("replicas")), settings.source or "<settings>",
                        "replicas.")
