"""The transport benchmark's jobs (its configuration, flows, identities and message bodies) and
its measurements: confirmed transfers by a pool of publishers, and goodput across a shaped link."""

from __future__ import annotations

import math
import queue as queue_mod
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nebula_mq import topology
from nebula_mq.errors import NebulaError, TransportError
from nebula_mq.settings import BrokerSettings, TransportSettings
from nebula_mq.topology import Flow
from nebula_mq.transport.reference import PlainPikaPublisher

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


# --------------------------------------------------------------------------- transfers


@dataclass(frozen=True)
class Transfer:
    messages: int
    payload_bytes: int  # per message
    # First publish -> last distinct message consumed (and acked) at the application.
    elapsed_s: float
    # First arrival -> last arrival: the link's steady state, without pipeline fill.
    steady_s: float
    duplicates: int
    missing: int

    @property
    def mbit(self) -> float:
        return self.messages * self.payload_bytes * 8 / self.elapsed_s / 1e6

    @property
    def steady_mbit(self) -> float:
        if self.messages < 2 or self.steady_s <= 0:
            return float("nan")
        return (self.messages - 1) * self.payload_bytes * 8 / self.steady_s / 1e6


def median_transfer(runs: Sequence[Transfer]) -> dict[str, Any]:
    """One report row from repeated runs of the same point: medians, every run's rate, losses summed."""
    return {
        "messages": runs[0].messages, "payload_bytes": runs[0].payload_bytes, "repeats": len(runs),
        "elapsed_s": statistics.median(r.elapsed_s for r in runs),
        "mbit": statistics.median(r.mbit for r in runs),
        "steady_mbit": statistics.median(r.steady_mbit for r in runs),
        "all_mbit": [round(r.mbit, 2) for r in runs],
        "duplicates": sum(r.duplicates for r in runs), "missing": sum(r.missing for r in runs),
    }


class Ends:
    """Producer and consumer transports of one flow, declared, with a probe round trip done."""

    def __init__(self, job: BenchJob, flow: Flow, settings: TransportSettings, prefetch: int) -> None:
        from nebula_mq.transport.rabbit import RabbitTransport

        consumer_identity = CONSUMER if flow.dst_cluster == B else PRODUCER
        self.producer = RabbitTransport(job.settings(flow.src_cluster, PRODUCER), settings, job.job_id,
                                        flow.src_cluster)
        self.consumer_side = RabbitTransport(job.settings(flow.dst_cluster, consumer_identity), settings,
                                             job.job_id, flow.dst_cluster)
        try:
            self.queue = self.producer.declare_flow(flow, "producer")  # every stripe's
            self.consumer_side.declare_flow(flow, "consumer")
            # A striped flow: one queue and one consumer per stripe (topology.stripe_flows).
            self.queues = [self.producer.queue_for(s) for s in topology.stripe_flows(flow)]
            self.consumers = [self.consumer_side.consume(q, prefetch) for q in self.queues]
            self.consumer = self.consumers[0]
            self._next = 0
            with self.producer.publisher() as pub:  # every federation link runs before the clock starts
                for q in self.queues:
                    pub.publish(q, b"probe", f"{job.job_id}/{q}/probe")
            for q, consumer in zip(self.queues, self.consumers):
                d = consumer.get(timeout=60)
                if d is None:
                    raise TransportError(f"{q}: probe message did not arrive within 60 s")
                d.ack()
        except NebulaError:
            self.close()
            raise

    def get(self, timeout: float) -> Any:
        """The next delivery from any stripe (round robin), or None after ``timeout``."""
        if len(self.consumers) == 1:
            return self.consumer.get(timeout=timeout)
        deadline = time.monotonic() + timeout
        while True:
            for _ in self.consumers:
                consumer = self.consumers[self._next]
                self._next = (self._next + 1) % len(self.consumers)
                d = consumer.get(timeout=0)
                if d is not None:
                    return d
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.002)

    def queue_of(self, index: int) -> str:
        """The queue of message ``index`` (``topology.stripe_of``)."""
        return self.queues[index % len(self.queues)]

    def close(self) -> None:
        self.producer.close()
        self.consumer_side.close()


class PublisherPool:
    """``threads`` publisher threads (one connection each) draining ``bodies`` in order.

    With ``pace`` (msgs/s) they share one schedule; a publish that waited on a full
    queue does not make the next ones burst to catch up.
    """

    def __init__(self, ends: Ends, bodies: Sequence[tuple[str, bytes]], threads: int, pace: float = 0.0,
                 on_confirmed: Callable[[str, float, float], None] | None = None, windowed: bool = False) -> None:
        """``windowed``: each thread submits without waiting (the publisher's window of confirms
        bounds what is outstanding) and flushes at the end, as the runtime's outboxes do."""
        self._work: queue_mod.SimpleQueue[tuple[str, bytes, str]] = queue_mod.SimpleQueue()
        for i, (mid, body) in enumerate(bodies):  # message i on stripe i % stripes
            self._work.put((mid, body, ends.queue_of(i)))
        self._pace = pace
        self._on_confirmed = on_confirmed
        self._windowed = windowed
        self._lock = threading.Lock()
        self._next_due = time.monotonic()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.publishers = [ends.producer.publisher() for _ in range(threads)]
        self._threads = [threading.Thread(target=self._loop, args=(p,), daemon=True) for p in self.publishers]

    def start(self) -> PublisherPool:
        for t in self._threads:
            t.start()
        return self

    def _loop(self, pub: Any) -> None:
        try:
            while not self.stop.is_set():
                if self._pace:
                    with self._lock:
                        self._next_due = due = max(self._next_due + 1 / self._pace, time.monotonic())
                    time.sleep(max(0.0, due - time.monotonic()))
                try:
                    mid, body, queue = self._work.get_nowait()
                except queue_mod.Empty:
                    break
                started = time.monotonic()
                if self._windowed:
                    pub.publish_async(queue, body, mid)
                    continue
                pub.publish(queue, body, mid)
                if self._on_confirmed:
                    self._on_confirmed(mid, started, time.monotonic())
            pub.flush()
        except NebulaError as exc:  # reported by join()
            self.errors.append(exc)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self.errors:
            raise TransportError(f"publisher failed: {self.errors[0]}")
        if any(t.is_alive() for t in self._threads):
            raise TransportError(f"publishers still busy after {timeout} s")

    def finished(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def stats(self) -> dict[str, float]:
        out = {"waits_full": 0.0, "waits_unroutable": 0.0, "waits_disconnected": 0.0, "waited_s": 0.0}
        for p in self.publishers:
            for k in out:
                out[k] += getattr(p.stats, k)
        return out


def transfer(job: BenchJob, flow: Flow, payload_bytes: int, count: int, publishers: int,
             timeout_s: float, plain_pika: bool = False, windowed: bool = False) -> Transfer:
    """Publish ``count`` envelopes on ``flow`` and consume them on its destination cluster.
    With ``plain_pika``, one plain pika publisher (``transport.reference``) replaces ours; with
    ``windowed``, ours submit without waiting for each confirm (``PublisherPool``)."""
    from nebula_mq.wire import decode_envelope

    bodies = tensor_bodies(job.job_id, flow.name, payload_bytes, count)
    wanted = {mid for mid, _ in bodies}
    prefetch = max(4, min(256, math.ceil(32 * MIB / max(payload_bytes, 1))))
    ends = Ends(job, flow, TransportSettings(), prefetch)
    seen: set[str] = set()
    duplicates, first_arrival, last_arrival = 0, None, 0.0
    try:
        pool: PublisherPool | PlainPikaPublisher  # connections open before the clock starts
        if plain_pika:
            pool = PlainPikaPublisher(job.settings(flow.src_cluster, PRODUCER),
                                      topology.flow_exchange(job.job_id, flow.name), ends.queue, bodies)
        else:
            pool = PublisherPool(ends, bodies, publishers, windowed=windowed)
        t0 = time.monotonic()
        pool.start()
        deadline = t0 + timeout_s
        while len(seen) < count and time.monotonic() < deadline:
            d = ends.get(timeout=1.0)
            if d is None:
                continue
            env = decode_envelope(d.body, max_bytes=payload_bytes + MIB)  # checksum: the bytes are intact
            if env.message_id != d.message_id or d.message_id not in wanted:
                raise TransportError(f"{flow.name}: unexpected message {d.message_id!r}")
            if d.message_id in seen:
                duplicates += 1
            else:
                seen.add(d.message_id)
                last_arrival = time.monotonic()
                first_arrival = first_arrival or last_arrival
            d.ack()
        pool.join(timeout=10)
    finally:
        ends.close()
    return Transfer(count, payload_bytes, last_arrival - t0, last_arrival - (first_arrival or t0),
                    duplicates, count - len(seen))


def goodput_points(job: BenchJob, cfg: BenchConfig, shape: Callable[[float], None], label: str,
                   say: Callable[[str], None], link_bytes: Callable[[], int] | None = None) -> list[dict[str, Any]]:
    """Goodput at every ``cfg.rates_mbit`` x ``cfg.sizes_mib`` x ``cfg.stripes`` point, ``shape(rate)``
    setting the link first: one row per point, median of ``cfg.repeats``, as a share of the link.
    With ``link_bytes`` (a byte counter of the shaped link), each row also says what crossed it."""
    runs: dict[tuple[float, int, int], list[Transfer]] = {}
    sent: dict[tuple[float, int, int], int] = {}
    for k in range(cfg.repeats):  # repeats interleaved: a busy spell on the host hits every point alike
        for rate in cfg.rates_mbit:
            shape(rate)
            for size in cfg.sizes_mib:
                for stripes in cfg.stripes:
                    n = cfg.goodput_messages(rate, size)
                    before = link_bytes() if link_bytes else 0
                    r = transfer(job, goodput_flow(rate, size, k, stripes), size * MIB, n, cfg.publishers,
                                 cfg.timeout_s)
                    if link_bytes:
                        sent[(rate, size, stripes)] = link_bytes() - before
                    runs.setdefault((rate, size, stripes), []).append(r)
                    say(f"  {label:7s} {rate:5g} Mbit/s {size:3d} MiB x {n:3d}, {stripes} stripe(s) (run {k + 1}/"
                        f"{cfg.repeats}): {r.mbit:6.1f} Mbit/s = {100 * r.mbit / rate:5.1f}% "
                        f"(steady {100 * r.steady_mbit / rate:5.1f}%)")
    rows = []
    for (rate, size, stripes), rs in runs.items():
        row = {"rate_mbit": rate, "delay_ms": cfg.delay_ms, "stripes": stripes, **median_transfer(rs)}
        if link_bytes:
            row["link_tx_bytes"] = sent[(rate, size, stripes)]
        row["percent"] = 100 * row["mbit"] / rate
        row["steady_percent"] = 100 * row["steady_mbit"] / rate
        rows.append(row)
    return rows
