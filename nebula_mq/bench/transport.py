"""``nebula-mq bench transport``: what the RabbitMQ transport delivers across the emulated WAN.

One run, on a TLS stack of its own (or ``--run-dir``), with its own job (fresh id,
one flow per measurement so no run sees another's leftovers):

* **goodput** of tensor messages (real ``nebula_mq.wire`` envelopes, one fp32
  tensor, codec ``none``) across the federated link shaped by the relay, as a
  share of the link rate. Clock: first publish -> last distinct message consumed
  on the other cluster; payload = tensor bytes only. Several publisher threads
  (one connection each) keep the pipe full: ``Publisher.publish`` waits for its
  confirm, so one publisher alone would send one message per confirm round trip.
* **unshaped** throughput and the ~1 KiB message rate, on one broker (local
  flow) and across the unlimited, undelayed relay;
* **recovery**: a paced producer keeps publishing while the WAN is cut (the
  bounded upstream queue fills, then the producer is nacked and waits); after
  the heal, time to the first arrival of a cut-time message and to the full
  drain, and an exactly-once check by message id (repeats counted separately).

``python -m nebula_mq.bench.transport`` takes the same options as ``nebula-mq
bench transport`` plus ``--run-dir``, ``--repeats`` and ``--cut-s``. Library use
(the integration test): provision a job with ``throughput_flows(cfg)`` and ``IDENTITIES``,
and a second job for ``RECOVERY_FLOW`` (see ``recovery``), then
``run_bench(stack, job, recovery_job, cfg)``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import queue as queue_mod
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from typing import Any, Protocol

from nebula_mq import topology
from nebula_mq.errors import NebulaError, TransportError
from nebula_mq.settings import BrokerSettings, TransportSettings
from nebula_mq.topology import Flow

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
    # Give up on a run whose messages have not all arrived after this long.
    timeout_s: float = 180.0

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls(sizes_mib=(1, 4), rates_mbit=(170.0,), seconds_per_run=2.0, min_messages=4, repeats=1,
                   unshaped_mib=16, unshaped_sizes_mib=(4,), small_messages=400, cut_s=5.0,
                   recovery_message_kib=256, recovery_pace=8.0, recovery_cap_mib=4, warmup_s=1.0,
                   timeout_s=60.0)

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


def goodput_flow(rate: float, size_mib: int, repeat: int) -> Flow:
    return Flow(f"g{rate:g}-{size_mib}m-{repeat}".replace(".", "p"), A, B)


# The recovery run has a job of its own: the cap of a cross-cluster flow is a per-job
# policy set at provisioning (``Stack.provision_job(max_queue_bytes=)``), and only
# that flow wants a small one.
RECOVERY_FLOW = Flow("recovery", A, B)


def throughput_flows(cfg: BenchConfig) -> tuple[Flow, ...]:
    """The flows of the goodput and unshaped runs: provision their job with these."""
    out = [goodput_flow(r, s, k) for k in range(cfg.repeats) for r in cfg.rates_mbit for s in cfg.sizes_mib]
    for s in [*cfg.unshaped_sizes_mib, "small"]:
        out += [Flow(f"lo-{s}", A, A), Flow(f"wan-{s}", A, B)]
    return tuple(out)


# --------------------------------------------------------------------------- messages


def tensor_bodies(job_id: str, flow: str, payload_bytes: int, count: int) -> list[tuple[str, bytes]]:
    """``count`` encoded envelopes of one fp32 tensor of ``payload_bytes`` each: (message id, body)."""
    import numpy as np

    from nebula_mq.codecs import parse_codec
    from nebula_mq.wire import Envelope, encode_envelope, pack_tensors

    cols = 1024 if payload_bytes >= 4096 else payload_bytes // 4
    x = np.random.default_rng(0).standard_normal((payload_bytes // 4 // cols, cols), dtype=np.float32)
    records = pack_tensors({"x": x}, parse_codec("none"))  # encoded once, shared by every envelope
    out = []
    for i in range(count):
        env = Envelope(job_id, flow, step=0, micro_batch=i, seq=i, producer=PRODUCER, tensors=records)
        out.append((env.message_id, encode_envelope(env)))
    return out


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


class _Ends:
    """Producer and consumer transports of one flow, declared, with a probe round trip done."""

    def __init__(self, job: BenchJob, flow: Flow, settings: TransportSettings, prefetch: int) -> None:
        from nebula_mq.transport.rabbit import RabbitTransport

        consumer_identity = CONSUMER if flow.dst_cluster == B else PRODUCER
        self.producer = RabbitTransport(job.settings(flow.src_cluster, PRODUCER), settings, job.job_id,
                                        flow.src_cluster)
        self.consumer_side = RabbitTransport(job.settings(flow.dst_cluster, consumer_identity), settings,
                                             job.job_id, flow.dst_cluster)
        try:
            self.queue = self.producer.declare_flow(flow, "producer")
            self.consumer_side.declare_flow(flow, "consumer")
            self.consumer = self.consumer_side.consume(self.queue, prefetch)
            with self.producer.publisher() as pub:  # the federation link runs before the clock starts
                pub.publish(self.queue, b"probe", f"{job.job_id}/{flow.name}/probe")
            d = self.consumer.get(timeout=60)
            if d is None:
                raise TransportError(f"{self.queue}: probe message did not arrive within 60 s")
            d.ack()
        except NebulaError:
            self.close()
            raise

    def close(self) -> None:
        self.producer.close()
        self.consumer_side.close()


class PublisherPool:
    """``threads`` publisher threads (one connection each) draining ``bodies`` in order.

    With ``pace`` (msgs/s) they share one schedule; a publish that waited on a full
    queue does not make the next ones burst to catch up.
    """

    def __init__(self, ends: _Ends, bodies: Sequence[tuple[str, bytes]], threads: int, pace: float = 0.0,
                 on_confirmed: Callable[[str, float, float], None] | None = None) -> None:
        self._work: queue_mod.SimpleQueue[tuple[str, bytes]] = queue_mod.SimpleQueue()
        for item in bodies:
            self._work.put(item)
        self._queue = ends.queue
        self._pace = pace
        self._on_confirmed = on_confirmed
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
                    mid, body = self._work.get_nowait()
                except queue_mod.Empty:
                    return
                started = time.monotonic()
                pub.publish(self._queue, body, mid)
                if self._on_confirmed:
                    self._on_confirmed(mid, started, time.monotonic())
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
             timeout_s: float) -> Transfer:
    """Publish ``count`` envelopes on ``flow`` and consume them on its destination cluster."""
    from nebula_mq.wire import decode_envelope

    bodies = tensor_bodies(job.job_id, flow.name, payload_bytes, count)
    wanted = {mid for mid, _ in bodies}
    prefetch = max(4, min(256, math.ceil(32 * MIB / max(payload_bytes, 1))))
    ends = _Ends(job, flow, TransportSettings(), prefetch)
    seen: set[str] = set()
    duplicates, first_arrival, last_arrival = 0, None, 0.0
    try:
        pool = PublisherPool(ends, bodies, publishers)  # connections open before the clock starts
        t0 = time.monotonic()
        pool.start()
        deadline = t0 + timeout_s
        while len(seen) < count and time.monotonic() < deadline:
            d = ends.consumer.get(timeout=1.0)
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


# --------------------------------------------------------------------------- recovery after a cut


def recovery(stack: Any, job: BenchJob, cfg: BenchConfig) -> dict[str, Any]:
    """Cut the WAN for ``cut_s`` under a paced producer, heal, time the backlog's return.

    ``job`` is provisioned with ``(RECOVERY_FLOW,)`` and ``max_queue_bytes =
    cfg.recovery_cap_mib * MIB``.
    """
    size = cfg.recovery_message_kib * 1024
    flow = RECOVERY_FLOW
    budget = int((cfg.warmup_s + cfg.cut_s) * cfg.recovery_pace) + 16
    bodies = tensor_bodies(job.job_id, flow.name, size, budget)
    settings = TransportSettings(publish_patience_s=cfg.cut_s + 300)
    stack.shape(None, rate_mbit=cfg.recovery_rate_mbit, delay_ms=cfg.delay_ms, cut=False)
    ends = _Ends(job, flow, settings, prefetch=max(4, math.ceil(16 * MIB / size)))
    confirmed: dict[str, tuple[float, float]] = {}  # id -> (publish started, confirmed)
    arrivals: dict[str, float] = {}
    duplicates = 0
    lock = threading.Lock()

    def on_confirmed(mid: str, started: float, done: float) -> None:
        with lock:
            confirmed[mid] = (started, done)

    pool = PublisherPool(ends, bodies, 1, pace=cfg.recovery_pace, on_confirmed=on_confirmed)
    upstream_max = 0
    try:
        pool.start()
        t_start = time.monotonic()
        t_cut = t_heal = None
        deadline = polled = 0.0
        while True:
            now = time.monotonic()
            if t_cut is None and now - t_start >= cfg.warmup_s:
                stack.cut()
                t_cut = time.monotonic()
            elif t_cut is not None and t_heal is None:
                if now - polled >= 0.5:
                    upstream_max = max(upstream_max, ends.producer.queue_depth(ends.queue) or 0)
                    polled = now
                if now - t_cut >= cfg.cut_s:
                    pool.stop.set()  # the publish in progress (maybe waiting on a full queue) completes
                    stack.heal()
                    t_heal = time.monotonic()
                    deadline = t_heal + cfg.timeout_s
            if t_heal is not None and pool.finished():  # never block here: we must keep consuming
                with lock:
                    if set(confirmed) <= set(arrivals) or time.monotonic() > deadline:
                        break
            d = ends.consumer.get(timeout=0.2)
            if d is None:
                continue
            if d.message_id in arrivals:
                duplicates += 1
            else:
                arrivals[d.message_id] = time.monotonic()
            d.ack()
        pool.join(timeout=5)  # surfaces a publisher error
        waits = pool.stats()
    finally:
        pool.stop.set()
        ends.close()
        stack.heal()
    assert t_cut is not None and t_heal is not None
    during = {m for m, (started, _) in confirmed.items() if t_cut <= started < t_heal}
    after_heal = [t for m, t in arrivals.items() if m in during and t >= t_heal]
    missing = set(confirmed) - set(arrivals)
    return {
        "cut_s": t_heal - t_cut, "message_bytes": size, "pace_msgs_s": cfg.recovery_pace,
        "upstream_cap_bytes": cfg.recovery_cap_mib * MIB, "rate_mbit": cfg.recovery_rate_mbit,
        "delay_ms": cfg.delay_ms, "published": len(confirmed), "published_during_cut": len(during),
        "upstream_max_messages": upstream_max, "producer_waits_full": int(waits["waits_full"]),
        "producer_waited_s": waits["waited_s"],
        "heal_to_first_arrival_s": (min(after_heal) - t_heal) if after_heal else None,
        "heal_to_drained_s": (max(arrivals[m] for m in confirmed) - t_heal) if not missing and confirmed else None,
        "arrived_during_cut": len(during & set(arrivals)), "missing": len(missing),
        "unexpected": len(set(arrivals) - set(confirmed)), "duplicates_discarded": duplicates,
        "exactly_once": not missing and not (set(arrivals) - set(confirmed)),
    }


# --------------------------------------------------------------------------- the whole bench


def _median_transfer(runs: list[Transfer]) -> dict[str, Any]:
    return {
        "messages": runs[0].messages, "payload_bytes": runs[0].payload_bytes, "repeats": len(runs),
        "elapsed_s": statistics.median(r.elapsed_s for r in runs),
        "mbit": statistics.median(r.mbit for r in runs),
        "steady_mbit": statistics.median(r.steady_mbit for r in runs),
        "all_mbit": [round(r.mbit, 2) for r in runs],
        "duplicates": sum(r.duplicates for r in runs), "missing": sum(r.missing for r in runs),
    }


def run_bench(stack: Any, job: BenchJob, recovery_job: BenchJob, cfg: BenchConfig,
              say: Callable[[str], None] = print) -> dict[str, Any]:
    """All measurements on a running ``stack``: ``job`` is provisioned with
    ``throughput_flows(cfg)``, ``recovery_job`` as ``recovery`` says.

    Leaves the WAN healed; the caller restores its shape.
    """
    result: dict[str, Any] = {"config": asdict(cfg), "unshaped": [], "goodput": []}
    stack.shape(None, rate_mbit=0, delay_ms=0, cut=False)
    for path, dst in (("loopback", A), ("federation", B)):
        prefix = "lo" if dst == A else "wan"
        for size in cfg.unshaped_sizes_mib:
            n = max(cfg.min_messages, cfg.unshaped_mib // size)
            r = transfer(job, Flow(f"{prefix}-{size}", A, dst), size * MIB, n, cfg.publishers, cfg.timeout_s)
            row = {"path": path, "payload_bytes": size * MIB, **_median_transfer([r]),
                   "MBps": n * size * MIB / r.elapsed_s / 1e6, "msgs_s": n / r.elapsed_s}
            result["unshaped"].append(row)
            say(f"  unshaped {path:10s} {size:3d} MiB x {n:4d}: {row['MBps']:7.1f} MB/s")
        r = transfer(job, Flow(f"{prefix}-small", A, dst), cfg.small_bytes, cfg.small_messages,
                     cfg.small_publishers, cfg.timeout_s)
        row = {"path": path, **_median_transfer([r]), "MBps": r.mbit / 8, "msgs_s": r.messages / r.elapsed_s}
        result["unshaped"].append(row)
        say(f"  unshaped {path:10s} {cfg.small_bytes} B x {r.messages}: {row['msgs_s']:7.0f} msgs/s")
    runs: dict[tuple[float, int], list[Transfer]] = {}
    for k in range(cfg.repeats):  # repeats interleaved: a busy spell on the host hits every point alike
        for rate in cfg.rates_mbit:
            stack.shape(None, rate_mbit=rate, delay_ms=cfg.delay_ms, cut=False)
            for size in cfg.sizes_mib:
                n = cfg.goodput_messages(rate, size)
                r = transfer(job, goodput_flow(rate, size, k), size * MIB, n, cfg.publishers, cfg.timeout_s)
                runs.setdefault((rate, size), []).append(r)
                say(f"  goodput {rate:5g} Mbit/s {size:3d} MiB x {n:3d} (run {k + 1}/{cfg.repeats}): "
                    f"{r.mbit:6.1f} Mbit/s = {100 * r.mbit / rate:5.1f}% (steady {100 * r.steady_mbit / rate:5.1f}%)")
    for (rate, size), rs in runs.items():
        row = {"rate_mbit": rate, "delay_ms": cfg.delay_ms, **_median_transfer(rs)}
        row["percent"] = 100 * row["mbit"] / rate
        row["steady_percent"] = 100 * row["steady_mbit"] / rate
        result["goodput"].append(row)
    say(f"  recovery: cutting the WAN for {cfg.cut_s:g} s ...")
    result["recovery"] = recovery(stack, recovery_job, cfg)
    return result


# --------------------------------------------------------------------------- report


def machine_facts(stack: Any) -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        rabbit = stack.rabbitmqctl(A, "version").strip()
    except NebulaError as exc:
        rabbit = f"unknown ({exc})"
    return {"cpu": cpu, "cores": os.cpu_count(), "load_avg_1_5_15": list(os.getloadavg()),
            "python": platform.python_version(), "pika": metadata.version("pika"), "rabbitmq": rabbit,
            "kernel": platform.release()}


def stack_facts(stack: Any, cfg: BenchConfig) -> dict[str, Any]:
    from nebula_mq.stack import provision, relay

    return {"clusters": list(stack.clusters), "tls": "TLS 1.2/1.3, certificate login (EXTERNAL)",
            "relay": {"shaped_rates_mbit": list(cfg.rates_mbit), "delay_ms_each_way": cfg.delay_ms,
                      "chunk_bytes": relay.CHUNK, "burst_s": relay.BURST_S},
            "federation": {"type": "queue federation", "ack_mode": provision.ACK_MODE,
                           "prefetch_count": provision.PREFETCH, "reconnect_delay_s": provision.RECONNECT_DELAY_S},
            "queues": "classic durable lazy, persistent messages, publisher confirms, manual acks",
            "messages": "nebula_mq.wire envelopes, one fp32 tensor, codec none (payload = tensor bytes)",
            "publisher_threads": cfg.publishers, "small_publisher_threads": cfg.small_publishers}


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // 1024} KiB" if n >= 1024 else f"{n} B"


def render(result: dict[str, Any]) -> str:
    cfg, m, st = result["config"], result["machine"], result["stack"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, load {m['load_avg_1_5_15'][0]:.2f} at start, "
             f"Python {m['python']}, pika {m['pika']}, RabbitMQ {m['rabbitmq']}",
             f"stack: {', '.join(st['clusters'])}; {st['tls']}; {st['federation']['type']}, ack-mode "
             f"{st['federation']['ack_mode']}, link prefetch {st['federation']['prefetch_count']}; {st['queues']}",
             f"messages: {st['messages']}; {cfg['publishers']} publisher threads (one connection each)", "",
             f"goodput across the federated TLS link, shaped by the relay (+{cfg['delay_ms']:g} ms each way);",
             f"first publish -> last message consumed on {B}, payload bytes; median of {cfg['repeats']}",
             f"{'link Mbit/s':>11} {'size':>7} {'msgs':>5} {'Mbit/s':>7} {'% link':>7} {'steady %':>9} "
             f"{'runs (Mbit/s)':>24} {'dup':>4} {'miss':>4}"]
    for r in result["goodput"]:
        lines.append(f"{r['rate_mbit']:11g} {_size(r['payload_bytes']):>7} {r['messages']:5d} {r['mbit']:7.1f} "
                     f"{r['percent']:7.1f} {r['steady_percent']:9.1f} {str(r['all_mbit']):>24} "
                     f"{r['duplicates']:4d} {r['missing']:4d}")
    lines += ["", "unshaped (relay unlimited, no delay); MB = 10^6 bytes",
              f"{'path':>11} {'size':>7} {'msgs':>5} {'MB/s':>7} {'msgs/s':>8} {'dup':>4} {'miss':>4}"]
    for r in result["unshaped"]:
        lines.append(f"{r['path']:>11} {_size(r['payload_bytes']):>7} {r['messages']:5d} {r['MBps']:7.1f} "
                     f"{r['msgs_s']:8.0f} {r['duplicates']:4d} {r['missing']:4d}")
    rc = result["recovery"]
    first, drained = rc["heal_to_first_arrival_s"], rc["heal_to_drained_s"]
    lines += ["", f"recovery: WAN cut {rc['cut_s']:.1f} s at {rc['rate_mbit']:g} Mbit/s +{rc['delay_ms']:g} ms; "
              f"{_size(rc['message_bytes'])} messages at {rc['pace_msgs_s']:g}/s, upstream cap {_size(rc['upstream_cap_bytes'])}",
              f"  published {rc['published']} ({rc['published_during_cut']} during the cut); upstream queue peaked at "
              f"{rc['upstream_max_messages']} msgs; producer nacked {rc['producer_waits_full']}x, "
              f"waited {rc['producer_waited_s']:.1f} s",
              f"  heal -> first cut-time message downstream: {'%.2f s' % first if first is not None else 'never'}; "
              f"heal -> drained: {'%.2f s' % drained if drained is not None else 'not drained'}",
              f"  exactly once: {rc['arrived_during_cut']}/{rc['published_during_cut']} cut-time messages arrived, "
              f"{rc['missing']} missing, {rc['unexpected']} unexpected, {rc['duplicates_discarded']} duplicates "
              f"discarded by message id -> {'OK' if rc['exactly_once'] else 'FAILED'}"]
    return "\n".join(lines)


def targets(result: dict[str, Any]) -> list[str]:
    out = []
    for r in result["goodput"]:
        if r["payload_bytes"] >= 4 * MIB:
            ok = r["percent"] >= 90
            out.append(f"goodput >= 90% at {r['rate_mbit']:g} Mbit/s, {_size(r['payload_bytes'])}: "
                       f"{'met' if ok else 'MISSED'} ({r['percent']:.1f}%)")
    out.append(f"recovery exactly once: {'met' if result['recovery']['exactly_once'] else 'MISSED'}")
    return out


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", help="use the stack in this run dir (started if down) instead of a fresh one")
    parser.add_argument("--repeats", type=int, help="repeats of each goodput point (default 3, quick 1)")
    parser.add_argument("--cut-s", type=float, help="seconds the WAN stays cut (default 30, quick 5)")


def _free_base_port(n: int = 2) -> int:
    from nebula_mq.stack.layout import DIST_OFFSET, RELAY_OFFSET

    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    for k in range(300):
        base = 20000 + (os.getpid() * 53 + k * 50) % 12000  # TLS/relay ports below the ephemeral range
        if all(free(base + o + i) for o in (0, RELAY_OFFSET, DIST_OFFSET) for i in range(n)):
            return base
    raise TransportError("no free port range for the bench stack")


def run(args: argparse.Namespace) -> int:
    from nebula_mq.stack import Stack, layout, node

    cfg = BenchConfig.quick() if args.quick else BenchConfig()
    if getattr(args, "repeats", None):
        cfg = replace(cfg, repeats=args.repeats)
    if getattr(args, "cut_s", None):
        cfg = replace(cfg, cut_s=args.cut_s)
    run_dir = getattr(args, "run_dir", None)
    tmp = None if run_dir else tempfile.mkdtemp(prefix="nebula-bench-", dir="/tmp")
    if run_dir and layout.StackLayout.load(run_dir) is not None:
        stack = Stack.open(run_dir)
    else:
        stack = Stack(run_dir or tmp, layout.DEFAULT_CLUSTERS, base_port=_free_base_port(),
                      prefix=f"nbb{os.getpid()}")
    started = not all(node.is_running(n) for n in stack.layout.nodes)
    shapes = {c: s.shape for c, s in stack.status().items()}
    job_id = f"bench-{os.getpid()}-{int(time.time())}"
    jobs = (job_id, f"{job_id}-r")
    try:
        if started:
            print(f"starting a stack in {stack.layout.run_dir} ...")
            stack.up()
        stack.provision_job(jobs[0], throughput_flows(cfg), IDENTITIES)
        stack.provision_job(jobs[1], (RECOVERY_FLOW,), IDENTITIES, max_queue_bytes=cfg.recovery_cap_mib * MIB)
        result: dict[str, Any] = {"machine": machine_facts(stack), "stack": stack_facts(stack, cfg),
                                  "job_ids": list(jobs)}
        t0 = time.monotonic()
        result.update(run_bench(stack, StackJob(stack, jobs[0]), StackJob(stack, jobs[1]), cfg))
        result["wall_s"] = time.monotonic() - t0
        result["machine"]["load_avg_1_5_15_end"] = list(os.getloadavg())
    except NebulaError as exc:
        print(f"bench transport failed: {exc}")
        return 1
    finally:
        for cluster, shape in shapes.items():  # the WAN as we found it
            stack.shape(cluster, rate_mbit=shape.rate_mbit, delay_ms=shape.delay_ms, cut=shape.cut)
        if started:
            stack.down()
        else:
            for c, j in itertools.product(stack.clusters, jobs):
                stack.rabbitmqctl(c, "delete_vhost", topology.vhost(j))
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    result["targets"] = targets(result)
    print("\n" + render(result) + "\n\ntargets:\n" + "\n".join("  " + t for t in result["targets"]))
    print(f"wall time {result['wall_s']:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
        print(f"wrote {args.json}")
    return 0 if result["recovery"]["exactly_once"] else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m nebula_mq.bench.transport``: the same bench, with every option."""
    parser = argparse.ArgumentParser(prog="python -m nebula_mq.bench.transport", description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--quick", action="store_true")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
