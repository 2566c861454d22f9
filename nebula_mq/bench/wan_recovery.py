"""The transport benchmark's recovery run: a paced producer through a WAN cut, then the heal."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from nebula_mq.bench.wan_jobs import MIB, RECOVERY_FLOW, BenchConfig, BenchJob, tensor_bodies
from nebula_mq.bench.wan_transfer import Ends, PublisherPool
from nebula_mq.settings import TransportSettings


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
    ends = Ends(job, flow, settings, prefetch=max(4, math.ceil(16 * MIB / size)))
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
