"""The transport benchmark's jobs: its configuration, flows, identities and message bodies."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from nebula_mq import topology
from nebula_mq.settings import BrokerSettings
from nebula_mq.topology import Flow

if TYPE_CHECKING:
    from nebula_mq.stack import Stack

A, B = "cluster-a", "cluster-b"
PRODUCER, CONSUMER = "bench-producer", "bench-consumer"
# Certificate identities the job provisions: the producer lives on A, the consumer on B
# (local-flow runs consume on A with the producer's identity).
IDENTITIES = {A: (PRODUCER,), B: (CONSUMER,)}
MIB = 1 << 20


@dataclass(frozen=True)
class BenchConfig:
    sizes_mib: tuple[int, ...] = (1, 4, 8, 16)
    rates_mbit: tuple[float, ...] = (60.0, 170.0)
    # One-way delay the relay adds on the shaped link (each direction).
    delay_ms: float = 20.0
    # Each goodput run moves this many seconds of link time, but at least min_messages.
    seconds_per_run: float = 10.0
    min_messages: int = 6
    repeats: int = 3
    # Payload moved per size by the unshaped throughput runs.
    unshaped_mib: int = 128
    # Unshaped runs use at most these sizes (a subset of sizes_mib keeps them short).
    unshaped_sizes_mib: tuple[int, ...] = (1, 4, 16)
    small_bytes: int = 1024
    small_messages: int = 3000
    # Each goodput point is measured with the flow striped over each of these numbers of queues
    # (``topology.stripe_flows``: one federation link each), side by side in the same run.
    stripes: tuple[int, ...] = (1,)
    # Publisher threads (one connection each) per run.
    publishers: int = 4
    small_publishers: int = 8
    cut_s: float = 30.0
    recovery_message_kib: int = 1024
    # The recovery producer publishes at this pace (msgs/s) when not held back.
    recovery_pace: float = 4.0
    # Cap of the recovery flow's bounded upstream queue: the cut overfills it.
    recovery_cap_mib: int = 48
    recovery_rate_mbit: float = 60.0
    # Publishing before the cut, so the flow is in steady state when the WAN drops.
    warmup_s: float = 3.0
    # ``--recovery``: the kinds of outage (``reset``: the relay's cut; ``drop``: a blackhole
    # that resets nothing), each at every one-way delay and outage length, repeated, side by side.
    # 5 s is shorter than the federation link's heartbeat (10 s); 45 s is well beyond the 20-30 s
    # of silence after which an end gives up (RabbitMQ checks every heartbeat interval and gives
    # up at the second silent check in a row: at 30 s a drop is a toss-up, measured).
    recovery_kinds: tuple[str, ...] = ("reset", "drop")
    recovery_delays_ms: tuple[float, ...] = (0.0, 20.0, 200.0)
    recovery_outages_s: tuple[float, ...] = (5.0, 45.0)
    # Give up on a run whose messages have not all arrived after this long.
    timeout_s: float = 180.0
    # Also time a plain pika publisher with confirms beside ours (one thread each, loopback).
    compare_pika: bool = False
    compare_sizes_mib: tuple[int, ...] = (1, 4, 16)
    compare_mib: int = 64  # payload per large-message run
    compare_small_messages: int = 2000

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls(sizes_mib=(1, 4), rates_mbit=(170.0,), seconds_per_run=2.0, min_messages=4, repeats=1,
                   unshaped_mib=16, unshaped_sizes_mib=(4,), small_messages=400, cut_s=5.0,
                   recovery_message_kib=256, recovery_pace=8.0, recovery_cap_mib=4, warmup_s=1.0,
                   recovery_delays_ms=(20.0,), recovery_outages_s=(2.0,),
                   timeout_s=60.0, compare_sizes_mib=(4,), compare_mib=16, compare_small_messages=300)

    def goodput_messages(self, rate_mbit: float, size_mib: int) -> int:
        return max(self.min_messages, math.ceil(rate_mbit * 1e6 / 8 * self.seconds_per_run / (size_mib * MIB)))


class BenchJob(Protocol):
    """A provisioned job (``tests.fixtures.stack.JobHandle`` is one)."""

    @property
    def job_id(self) -> str: ...

    def settings(self, cluster: str, identity: str) -> BrokerSettings: ...


@dataclass(frozen=True)
class StackJob:
    stack: Any  # nebula_mq.stack.Stack
    job_id: str

    def settings(self, cluster: str, identity: str) -> BrokerSettings:
        return self.stack.broker_settings(cluster, identity, vhost=topology.vhost(self.job_id))


def goodput_flow(rate: float, size_mib: int, repeat: int, stripes: int = 1) -> Flow:
    name = f"g{rate:g}-{size_mib}m-{repeat}".replace(".", "p") + (f"-x{stripes}" if stripes > 1 else "")
    return Flow(name, A, B, stripes=stripes)


def goodput_flows(cfg: BenchConfig) -> tuple[Flow, ...]:
    """Every goodput point's flow (logical: a striped one stands for its stripes)."""
    return tuple(goodput_flow(r, s, k, x) for k in range(cfg.repeats) for r in cfg.rates_mbit for s in cfg.sizes_mib
                 for x in cfg.stripes)


# The recovery run has a job of its own: the cap of a cross-cluster flow is a per-job
# policy set at provisioning (``Stack.provision_job(max_queue_bytes=)``), and only
# that flow wants a small one.
RECOVERY_FLOW = Flow("recovery", A, B)


def throughput_flows(cfg: BenchConfig) -> tuple[Flow, ...]:
    """The flows of the goodput and unshaped runs: provision their job with these."""
    out = list(topology.physical_flows(goodput_flows(cfg)))
    for s in [*cfg.unshaped_sizes_mib, "small"]:
        out += [Flow(f"lo-{s}", A, A), Flow(f"wan-{s}", A, B)]
    if cfg.compare_pika:
        out += [compare_flow(s, k, who) for k in range(cfg.repeats) for s in [*cfg.compare_sizes_mib, 0]
                for who in COMPARED]
    return tuple(out)


#: The publishers ``--compare-pika`` times: ours with its window of confirms (as the runtime's
#: outboxes publish), ours one confirmed publish at a time, and plain pika.
COMPARED = ("windowed", "blocking", "pika")


def compare_flow(size_mib: int, repeat: int, who: str) -> Flow:
    """A local flow (one broker) for one ``--compare-pika`` run; size 0 = the small messages."""
    return Flow(f"cmp-{size_mib or 'small'}-{repeat}-{who}", A, A)


# --------------------------------------------------------------------------- messages


def tensor_bodies(job_id: str, flow: str, payload_bytes: int, count: int, first_seq: int = 0) -> list[tuple[str, bytes]]:
    """``count`` encoded envelopes of one fp32 tensor of ``payload_bytes`` each: (message id, body).

    ``first_seq``: where their sequence numbers (hence message ids) start, so runs that share
    a flow never share an id."""
    import numpy as np

    from nebula_mq.codecs import parse_codec
    from nebula_mq.wire import Envelope, encode_envelope, pack_tensors

    cols = 1024 if payload_bytes >= 4096 else payload_bytes // 4
    x = np.random.default_rng(0).standard_normal((payload_bytes // 4 // cols, cols), dtype=np.float32)
    records = pack_tensors({"x": x}, parse_codec("none"))  # encoded once, shared by every envelope
    out = []
    for i in range(count):
        env = Envelope(job_id, flow, step=0, micro_batch=i, seq=first_seq + i, producer=PRODUCER, tensors=records)
        out.append((env.message_id, encode_envelope(env)))
    return out


# --------------------------------------------------------------------------- the stack


@contextlib.contextmanager
def bench_stack(run_dir: str | None) -> Iterator[tuple[Stack, bool]]:
    """The stack at ``run_dir`` (started if down, left as found, its WAN's shape restored), or a
    fresh one on free ports, removed afterwards; and whether it was started here."""
    from nebula_mq.stack import Stack, layout, node

    tmp = None if run_dir else tempfile.mkdtemp(prefix="nebula-bench-", dir="/tmp")
    if run_dir and layout.StackLayout.load(run_dir) is not None:
        stack = Stack.open(run_dir)
    else:
        stack = Stack(run_dir or tmp, layout.DEFAULT_CLUSTERS,
                      base_port=layout.free_base_port(len(layout.DEFAULT_CLUSTERS), os.getpid()),
                      prefix=f"nbb{os.getpid()}")
    started = not all(node.is_running(n) for n in stack.layout.nodes)
    shapes = {c: s.shape for c, s in stack.status().items()}
    try:
        if started:
            print(f"starting a stack in {stack.layout.run_dir} ...")
            stack.up()
        yield stack, started
    finally:
        try:
            for cluster, shape in shapes.items():  # the WAN as we found it
                stack.shape(cluster, rate_mbit=shape.rate_mbit, delay_ms=shape.delay_ms, cut=shape.cut,
                            drop=shape.drop)
        finally:  # a stack started here goes down even when its WAN could not be restored
            try:
                if started:
                    stack.down()
            finally:
                if tmp:
                    shutil.rmtree(tmp, ignore_errors=True)


def delete_vhosts(stack: Stack, job_ids: Iterable[str]) -> None:
    """Remove the jobs' vhosts from every cluster; one that fails (or was never made) is said, not raised,
    so the next is still removed and the bench's own error is the one that shows."""
    from nebula_mq.errors import NebulaError

    for cluster, job_id in itertools.product(stack.clusters, job_ids):
        try:
            stack.rabbitmqctl(cluster, "delete_vhost", topology.vhost(job_id))
        except NebulaError as exc:
            print(f"cleanup: {cluster}: vhost of {job_id} not deleted: {exc}")
