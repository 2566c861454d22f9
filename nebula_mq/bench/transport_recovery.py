"""The transport benchmark's recovery runs: a paced producer through a WAN outage, then the heal.

Two kinds of outage: ``reset`` (the relay's cut: every connection reset, new ones refused) and
``drop`` (a blackhole: nothing crosses, nothing is reset). ``recovery`` times one run;
``recovery_grid`` runs both kinds side by side at several delays and outage lengths.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from nebula_mq import topology
from nebula_mq.bench.transport_runs import (MIB, RECOVERY_FLOW, BenchConfig, BenchJob, Ends, PublisherPool,
                                            tensor_bodies)
from nebula_mq.errors import StackError
from nebula_mq.settings import TransportSettings

KINDS = ("reset", "drop")
# Message ids of one run start at run * SEQ_STRIDE: runs on one flow never share an id.
SEQ_STRIDE = 1_000_000


def link_reconnects(stack: Any, job_id: str, since: float) -> int:
    """Federation links of ``job_id`` whose connection opened after ``since`` (wall clock, this host's
    brokers) and is open now: a link that came back after a reset has a new one, a link that rode an
    outage out does not. Asked of the brokers, so other jobs' links on the same stack do not count."""
    vhost, n = topology.vhost(job_id), 0
    for cluster in stack.clusters:
        out = stack.rabbitmqctl(cluster, "list_connections", "vhost", "user", "connected_at",
                                "--formatter", "json", "--quiet")
        try:
            rows: list[dict[str, Any]] = json.loads(out or "[]")
            # A peer's federation link logs in as federation-<peer> (security.certs.federation_identity).
            n += sum(1 for r in rows if r["vhost"] == vhost and str(r["user"]).startswith("federation-")
                     and int(r["connected_at"]) >= since * 1000)
        except (ValueError, KeyError, TypeError) as exc:
            raise StackError(f"{cluster}: unexpected list_connections output ({exc}): {out[:200]!r}") from None
    return n


def recovery(stack: Any, job: BenchJob, cfg: BenchConfig, kind: str = "reset", outage_s: float | None = None,
             delay_ms: float | None = None, run: int = 0) -> dict[str, Any]:
    """Cut (``reset``) or drop the WAN for ``outage_s`` (default ``cfg.cut_s``) under a paced
    producer, heal, time the backlog's return; ``delay_ms`` each way (default ``cfg.delay_ms``).

    ``job`` is provisioned with ``(RECOVERY_FLOW,)`` and ``max_queue_bytes =
    cfg.recovery_cap_mib * MIB``; ``run`` numbers the runs that share it (their message ids).
    """
    if kind not in KINDS:
        raise ValueError(f"outage kind must be one of {', '.join(KINDS)}, got {kind!r}")
    outage_s = cfg.cut_s if outage_s is None else outage_s
    delay_ms = cfg.delay_ms if delay_ms is None else delay_ms
    size = cfg.recovery_message_kib * 1024
    flow = RECOVERY_FLOW
    budget = int((cfg.warmup_s + outage_s) * cfg.recovery_pace) + 16
    bodies = tensor_bodies(job.job_id, flow.name, size, budget, first_seq=run * SEQ_STRIDE)
    ours = {mid for mid, _ in bodies}
    settings = TransportSettings(publish_patience_s=outage_s + 300)
    stack.link_up(None, rate_mbit=cfg.recovery_rate_mbit, delay_ms=delay_ms)
    ends = Ends(job, flow, settings, prefetch=max(4, math.ceil(16 * MIB / size)))
    confirmed: dict[str, tuple[float, float]] = {}  # id -> (publish started, confirmed)
    arrivals: dict[str, float] = {}
    duplicates = strays = 0
    first_after_heal: float | None = None  # any of ours, a repeat included: the link moves again
    lock = threading.Lock()

    def on_confirmed(mid: str, started: float, done: float) -> None:
        with lock:
            confirmed[mid] = (started, done)

    pool = PublisherPool(ends, bodies, 1, pace=cfg.recovery_pace, on_confirmed=on_confirmed)
    upstream_max = 0
    since = time.time()
    try:
        pool.start()
        t_start = time.monotonic()
        t_cut = t_heal = None
        deadline = polled = 0.0
        while True:
            now = time.monotonic()
            if t_cut is None and now - t_start >= cfg.warmup_s:
                since = time.time()  # a federation connection opened from now on is a reconnect
                if kind == "reset":
                    stack.cut()
                else:
                    stack.drop()
                t_cut = time.monotonic()
            elif t_cut is not None and t_heal is None:
                if now - polled >= 0.5:
                    upstream_max = max(upstream_max, ends.producer.queue_depth(ends.queue) or 0)
                    polled = now
                if now - t_cut >= outage_s:
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
            if d.message_id not in ours:
                strays += 1  # an earlier run's late repeat, or its probe
                d.ack()
                continue
            if t_heal is not None and first_after_heal is None:
                first_after_heal = time.monotonic()
            if d.message_id in arrivals:
                duplicates += 1
            else:
                arrivals[d.message_id] = time.monotonic()
            d.ack()
        pool.join(timeout=5)  # surfaces a publisher error
        waits = pool.stats()
    finally:
        pool.stop.set()
        try:
            stack.heal()  # first: a failing close must not leave a shared stack's WAN down
        finally:
            ends.close()
    reconnects = link_reconnects(stack, job.job_id, since)
    assert t_cut is not None and t_heal is not None
    during = {m for m, (started, _) in confirmed.items() if t_cut <= started < t_heal}
    after_heal = [t for m, t in arrivals.items() if m in during and t >= t_heal]
    missing = set(confirmed) - set(arrivals)
    return {
        "kind": kind, "outage_s": outage_s, "measured_outage_s": t_heal - t_cut, "link_reconnects": reconnects,
        "strays": strays,
        "message_bytes": size, "pace_msgs_s": cfg.recovery_pace,
        "upstream_cap_bytes": cfg.recovery_cap_mib * MIB, "rate_mbit": cfg.recovery_rate_mbit,
        "delay_ms": delay_ms, "published": len(confirmed), "published_during_outage": len(during),
        "upstream_max_messages": upstream_max, "producer_waits_full": int(waits["waits_full"]),
        "producer_waited_s": waits["waited_s"],
        "heal_to_first_outage_message_s": (min(after_heal) - t_heal) if after_heal else None,
        "heal_to_first_message_s": (first_after_heal - t_heal) if first_after_heal is not None else None,
        "heal_to_drained_s": (max(arrivals[m] for m in confirmed) - t_heal) if not missing and confirmed else None,
        "arrived_during_outage": len(during & set(arrivals)), "missing": len(missing),
        "unexpected": len(set(arrivals) - set(confirmed)), "duplicates_discarded": duplicates,
        "exactly_once": not missing and not (set(arrivals) - set(confirmed)),
    }


def recovery_grid(stack: Any, job: BenchJob, cfg: BenchConfig,
                  say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """``recovery`` for every kind, one-way delay, outage length and repeat of ``cfg``'s
    ``recovery_*`` fields; the kinds alternate run by run, so they see the same machine."""
    runs = []
    points = itertools.product(cfg.recovery_delays_ms, cfg.recovery_outages_s, range(cfg.repeats),
                               cfg.recovery_kinds)
    for n, (delay, outage, _, kind) in enumerate(points):
        r = recovery(stack, job, cfg, kind=kind, outage_s=outage, delay_ms=delay, run=n + 1)
        runs.append(r)
        say(f"  {kind:5s} {outage:4g} s at +{delay:g} ms: heal -> first message {_s(r['heal_to_first_message_s'])}, "
            f"first outage-time message {_s(r['heal_to_first_outage_message_s'])}, "
            f"drained {_s(r['heal_to_drained_s'])}; "
            f"link reconnects {r['link_reconnects']}, exactly once {'OK' if r['exactly_once'] else 'FAILED'}")
    return runs


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.2f} s"


def _median(values: list[float | None]) -> float | None:
    """Median of the runs, None when any run never got there (a median would hide it)."""
    return None if not values or any(v is None for v in values) else statistics.median(v for v in values if v is not None)


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (delay, outage, kind): medians over the repeats, the round trip, the worst case."""
    rows = []
    # Grouped on the outage asked for: the measured one adds polling and the heal's own time.
    key: Callable[[dict[str, Any]], tuple[float, float, int]] = (
        lambda r: (r["delay_ms"], r["outage_s"], KINDS.index(r["kind"])))
    for (delay, outage, k), group in itertools.groupby(sorted(runs, key=key), key=key):
        rs = list(group)
        rtt = 2 * delay / 1000.0
        first = _median([r["heal_to_first_message_s"] for r in rs])
        rows.append({
            "kind": KINDS[k], "delay_ms": delay, "outage_s": outage, "repeats": len(rs), "rtt_s": rtt,
            "first_message_s": first, "first_message_rtts": first / rtt if first is not None and rtt else None,
            "first_outage_message_s": _median([r["heal_to_first_outage_message_s"] for r in rs]),
            "drained_s": _median([r["heal_to_drained_s"] for r in rs]),
            "all_first_message_s": [r["heal_to_first_message_s"] for r in rs],
            "link_reconnects": [r["link_reconnects"] for r in rs],
            "exactly_once": all(r["exactly_once"] for r in rs), "duplicates": sum(r["duplicates_discarded"] for r in rs),
        })
    return rows
