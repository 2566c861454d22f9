"""The transport benchmark's measurements: confirmed transfers by a pool of publishers, the
WAN-cut recovery run, and ``run_bench``, which runs them all (see ``nebula_mq.bench.transport``)."""

from __future__ import annotations

import math
import queue as queue_mod
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nebula_mq import topology
from nebula_mq.bench.wan_jobs import B, CONSUMER, MIB, PRODUCER, BenchConfig, BenchJob, goodput_flow, tensor_bodies
from nebula_mq.errors import NebulaError, TransportError
from nebula_mq.settings import TransportSettings
from nebula_mq.topology import Flow
from nebula_mq.transport.reference import PlainPikaPublisher


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


# --------------------------------------------------------------------------- recovery after a cut


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
