"""The generic split-model job: a user's model cut in two, head on one cluster, tail on the other.

The head (cluster ``head_cluster``) runs the bottom layers on its own inputs and
publishes the activation; the tail (cluster ``tail_cluster``) owns the targets,
computes the loss and replies with d loss / d activation. Only activations,
gradients and sample ids cross the WAN, compressed by the job's
``[codec] forward`` / ``backward`` chains. The schedule, replay and resume
contract are those of ABNet (``workers.abnet.encoder``), of which this is the
model-agnostic form.

What the user supplies is a :class:`HeadSpec` / :class:`TailSpec`: either passed
to :func:`workers.split.run_head` / ``run_tail`` in a few lines of their own
script, or built by a function named in the job file (``[split] head =
"pkg.module:build_head"``) so that ``nebula-mq run job.toml`` starts both sides.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from nebula_mq import config, topology
from nebula_mq.errors import ConfigError, ModelError
from nebula_mq.models.frameworks import FRAMEWORKS
from nebula_mq.models.group_address import GroupAddress
from nebula_mq.settings import DEVICE_PATTERN, Settings
from workers.split.shards import Ranks, rank_id

# The roles' registered names: what plans launch and `worker --role` takes.
HEAD_ROLE = "split-head"
TAIL_ROLE = "split-tail"

# head(micro_batch) -> (sample_ids int64 [B], input arrays...): deterministic in the
# micro-batch index (a resumed head must rebuild exactly what a clean one sent).
InputsFn = Callable[[int], Sequence[np.ndarray]]
# tail(sample_ids) -> the target arrays of those samples (one array or a tuple).
TargetsFn = Callable[[np.ndarray], "np.ndarray | Sequence[np.ndarray]"]
# loss(tail output, *targets as tensors) -> scalar tensor (the tail model's framework).
LossFn = Callable[..., Any]
# optimizer_fn(trainable parameters, lr) -> optimizer of the model's framework.
OptimizerFn = Callable[[list[Any], float], Any]


@dataclass(frozen=True)
class Placement:
    """Where the two halves of a split model run and how they are bound, spelled the same way
    by every split job: ``[split]``, and ``[abnet]``, which extends it."""

    # The cluster the head ranks run on, and whose broker they use (the local stack's
    # cluster-a unless the job names its own).
    head_cluster: str = "cluster-a"
    # The cluster the tail ranks run on; the same as head_cluster for an in-cluster baseline.
    tail_cluster: str = "cluster-b"
    # Worker id of head rank 0 (rank r is <head_id>-r<r>): names its reply flow, checkpoint
    # dir, status and metrics files.
    head_id: str = "head-0"
    # Worker id of tail rank 0 (rank r is <tail_id>-r<r>): names its checkpoint dir, status and
    # metrics files.
    tail_id: str = "tail-0"
    # Micro-batches whose gradient is not back yet (1 = exact, lockstep training).
    in_flight: int = 1
    # Steps between checkpoints (and at the last step): what a restart may have to redo.
    checkpoint_every: int = 10
    # Learning rate handed to both sides' optimizers.
    lr: float = 1e-3
    # Data-parallel ranks of the head (workers.split.shards): each micro-batch is cut into
    # head_ranks x tail_ranks equal pieces; the head ranks all-reduce their gradients.
    head_ranks: int = 1
    # Data-parallel ranks of the tail; the tail ranks all-reduce their gradients.
    tail_ranks: int = 1
    # The head's device, overriding [job] device ("" = [job] device).
    head_device: str = ""
    # The tail's device, overriding [job] device ("" = [job] device).
    tail_device: str = ""
    # The host of every rank of a side whose ranks all run on one host (when head_hosts /
    # tail_hosts are not set).
    gloo_host: str = "127.0.0.1"
    # The host of each head rank, in rank order, when the head side spans several hosts of its
    # cluster: head rank r runs on head_hosts[r] (a name or address the other hosts reach), and
    # the head group's rendezvous is on head_hosts[0]. Empty: every head rank on gloo_host.
    head_hosts: tuple[str, ...] = ()
    # The host of each tail rank, in rank order, as head_hosts is for the head.
    tail_hosts: tuple[str, ...] = ()
    # The head group's rendezvous port; head rank r listens on head_gloo_port + 1 + r. Keep
    # the ports below the kernel's ephemeral range (Linux: 32768-60999), where outgoing
    # connections could take them first.
    head_gloo_port: int = 29200
    # The tail group's rendezvous port; tail rank r listens on tail_gloo_port + 1 + r.
    tail_gloo_port: int = 29300
    # A collective (or the rendezvous) that has not completed after this long means a rank
    # is gone: the rank exits, and the group restarts from its last common checkpoint.
    group_timeout_s: float = 300.0
    # Queues each activation and gradient flow is striped over: each stripe has its own
    # federation link, so one slow link (one TCP and TLS stream) no longer bounds the flow.
    # Micro-batch i travels on stripe i % stripes; the receiver applies them in order.
    stripes: int = 1

    def validate(self) -> None:
        if self.in_flight < 1:
            raise ValueError("in_flight >= 1")
        if not 1 <= self.stripes <= topology.MAX_STRIPES:
            raise ValueError(f"stripes in 1..{topology.MAX_STRIPES}")
        if self.head_ranks < 1 or self.tail_ranks < 1:
            raise ValueError("head_ranks >= 1 and tail_ranks >= 1")
        for side, hosts, ranks in (("head", self.head_hosts, self.head_ranks), ("tail", self.tail_hosts, self.tail_ranks)):
            if hosts and len(hosts) != ranks:
                raise ValueError(f"{side}_hosts: one host per rank ({side}_ranks = {ranks}), got {len(hosts)}")
            if any(not h.strip() or ":" in h for h in hosts):
                raise ValueError(f"{side}_hosts: host names or addresses, without ports")
        for device in (self.head_device, self.tail_device):
            if device and not DEVICE_PATTERN.match(device):
                raise ValueError("head_device / tail_device: cpu, gpu, gpu:N, auto or empty")
        for port in (self.head_gloo_port, self.tail_gloo_port):
            if not 0 < port < 65000:
                raise ValueError("head_gloo_port / tail_gloo_port: a port below 65000")
        if not self.group_timeout_s > 0:
            raise ValueError("group_timeout_s > 0")
        if self.checkpoint_every < 1:
            raise ValueError("checkpoint_every >= 1")
        if not self.lr > 0:
            raise ValueError("lr > 0")

    @property
    def ranks(self) -> Ranks:
        return Ranks(self.head_ranks, self.tail_ranks)

    def group_address(self, side: str) -> GroupAddress:
        """Where ``side``'s ranks meet (``models.group_address``): every rank of the side is given
        the same one."""
        head = side == "head"
        ranks = self.head_ranks if head else self.tail_ranks
        hosts = (self.head_hosts if head else self.tail_hosts) or (self.gloo_host,) * ranks
        return GroupAddress.on_hosts(hosts, self.head_gloo_port if head else self.tail_gloo_port)

    def head_ids(self) -> tuple[str, ...]:
        return tuple(rank_id(self.head_id, r) for r in range(self.head_ranks))

    def tail_ids(self) -> tuple[str, ...]:
        return tuple(rank_id(self.tail_id, r) for r in range(self.tail_ranks))

    def flows(self) -> tuple[topology.Flow, ...]:
        """Activations head -> tail (requests), one flow per tail rank, then gradients
        tail -> head (replies), one flow per head rank (``workers.split.shards``); logical
        flows, each of ``stripes`` queues (``topology.physical_flows``)."""
        return topology.abnet_flows(self.head_cluster, self.tail_cluster, self.head_ids(), self.tail_ranks,
                                    self.stripes)

    def activation_flows(self) -> tuple[topology.Flow, ...]:
        return self.flows()[: self.tail_ranks]

    def reply_flows(self) -> tuple[topology.Flow, ...]:
        return self.flows()[self.tail_ranks:]


@dataclass(frozen=True)
class SplitJob(Placement):
    """The ``[split]`` section of a job file: the placement, and the user's model."""

    # "module:function" returning a HeadSpec / TailSpec from the Settings; only needed
    # by `nebula-mq run` (a user's own script passes the spec directly).
    head: str = ""
    tail: str = ""  # the same for the tail: a function returning a TailSpec
    # The head model's framework, "paddle" or "torch"; "" = whichever the model is. When set,
    # a model of the other framework is refused before anything is sent.
    head_framework: str = ""
    # The tail model's framework, as head_framework is for the head.
    tail_framework: str = ""

    def validate(self) -> None:
        super().validate()
        for value in (self.head_framework, self.tail_framework):
            if value not in ("", *FRAMEWORKS):
                raise ValueError(f"head_framework / tail_framework: one of {list(FRAMEWORKS)} or empty")


def micro_batch_seed(job_seed: int, side: str, mb: int) -> int:
    """Seed for dropout of micro-batch ``mb``: a function of the schedule, not of history,
    so a worker resumed from a checkpoint draws exactly what a clean run draws."""
    digest = hashlib.sha256(f"{job_seed}/{side}/{mb}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def load_split_job(settings: Settings) -> SplitJob:
    return config.build(SplitJob, dict(settings.section("split")), settings.source or "<settings>", "split.")


@dataclass(frozen=True)
class HeadSpec:
    """What the head side of a user's split model is."""

    model: Any  # a paddle.nn.Layer or torch.nn.Module: model(*input tensors) -> activation tensor
    inputs: InputsFn
    optimizer_fn: OptimizerFn | None = None  # None: Adam at [split] lr, in the model's framework

    def __post_init__(self) -> None:
        _functions("head", inputs=self.inputs, optimizer_fn=self.optimizer_fn)


@dataclass(frozen=True)
class TailSpec:
    """What the tail side of a user's split model is."""

    model: Any  # a paddle.nn.Layer or torch.nn.Module: model(activation) -> output tensor
    loss: LossFn
    targets: TargetsFn
    optimizer_fn: OptimizerFn | None = None  # None: Adam at [split] lr, in the model's framework
    # What a model that learnt nothing scores on this loss (predicting the mean, or chance):
    # recorded beside the loss at every step, and printed beside it when the job ends.
    baseline: float | None = None

    def __post_init__(self) -> None:
        _functions("tail", loss=self.loss, targets=self.targets, optimizer_fn=self.optimizer_fn)


def _functions(side: str, **given: object) -> None:
    """A spec's functions are functions, checked when it is made: before its side consumes
    anything (``optimizer_fn`` may be None)."""
    for name, value in given.items():
        if not callable(value) and not (name == "optimizer_fn" and value is None):
            raise ModelError(f"the {side}'s {name} must be a function, got {type(value).__name__}")


@overload
def load_spec(settings: Settings, side: Literal["head"]) -> HeadSpec: ...


@overload
def load_spec(settings: Settings, side: Literal["tail"]) -> TailSpec: ...


def load_spec(settings: Settings, side: str) -> HeadSpec | TailSpec:
    """The HeadSpec (``side`` "head") or TailSpec ("tail") the job's ``[split] <side>`` builder makes;
    anything else is a one-line ConfigError."""
    where, job = settings.source or "<settings>", load_split_job(settings)
    home = Path(settings.source).resolve().parent if settings.source else None
    builder = config.load_function(where, f"split.{side}", job.head if side == "head" else job.tail, home)
    spec = builder(settings)
    wanted = HeadSpec if side == "head" else TailSpec
    if not isinstance(spec, wanted):
        raise ConfigError(where, f"split.{side}", f"a function returning {wanted.__name__}", type(spec).__name__)
    return spec
