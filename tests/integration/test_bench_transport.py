"""``nebula-mq bench transport --quick`` against the session stack: the figures are sane.

Not a performance gate (the host is shared): goodput must be positive and bounded
by the link, every message published during the WAN cut must arrive exactly once,
and the recovery times must be measured.
"""

from __future__ import annotations

from typing import Any

import pytest

from nebula_mq.bench import transport as bench

pytest_plugins = ["tests.fixtures.stack"]


@pytest.mark.broker
@pytest.mark.timeout(120)
def test_quick_transport_bench_measures_goodput_and_exactly_once_recovery(stack: Any) -> None:
    cfg = bench.BenchConfig.quick()
    job = stack.new_job(flows=bench.throughput_flows(cfg), identities=bench.IDENTITIES, prefix="tb")
    recovery_job = stack.new_job(flows=(bench.RECOVERY_FLOW,), identities=bench.IDENTITIES, prefix="tr",
                                 max_queue_bytes=cfg.recovery_cap_mib * bench.MIB)
    try:
        result = bench.run_bench(stack.stack, job, recovery_job, cfg)
    finally:
        stack.clean_wan()
    result["machine"] = bench.machine_facts(stack.stack)
    result["stack"] = bench.stack_facts(stack.stack, cfg)
    print(bench.render(result))

    points = {(r["rate_mbit"], r["payload_bytes"]) for r in result["goodput"]}
    assert points == {(rate, size * bench.MIB) for rate in cfg.rates_mbit for size in cfg.sizes_mib}
    for r in result["goodput"]:
        assert r["missing"] == 0
        assert r["messages"] == cfg.goodput_messages(r["rate_mbit"], r["payload_bytes"] // bench.MIB)
        # Positive, and no faster than the relay lets through (small slack: the clock starts
        # at the first publish, the relay's bucket may hold a 10 ms burst).
        assert 0 < r["mbit"] <= 1.05 * r["rate_mbit"]
    paths = {(r["path"], r["payload_bytes"]) for r in result["unshaped"]}
    assert paths == {(p, s) for p in ("loopback", "federation")
                     for s in (*[m * bench.MIB for m in cfg.unshaped_sizes_mib], cfg.small_bytes)}
    for r in result["unshaped"]:
        assert r["missing"] == 0 and r["MBps"] > 0 and r["msgs_s"] > 0

    rc = result["recovery"]
    assert rc["cut_s"] >= cfg.cut_s
    assert rc["published_during_cut"] > 0
    assert rc["arrived_during_cut"] == rc["published_during_cut"]
    assert rc["missing"] == 0 and rc["unexpected"] == 0 and rc["exactly_once"]
    # The cut overfilled the bounded upstream queue: the producer was held back, the cap held.
    assert rc["producer_waits_full"] > 0
    assert 0 < rc["upstream_max_messages"] * rc["message_bytes"] <= rc["upstream_cap_bytes"]
    first, drained = rc["heal_to_first_arrival_s"], rc["heal_to_drained_s"]
    assert first is not None and drained is not None
    assert 0 < first <= drained < cfg.timeout_s
