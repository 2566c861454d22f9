"""``nebula-mq bench transport --quick`` against the session stack: the figures are sane.

Not a performance gate (the host is shared): goodput must be positive and bounded
by the link, every message published during the WAN cut must arrive exactly once,
and the recovery times must be measured.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from nebula_mq.bench import transport as bench

pytest_plugins = ["tests.fixtures.stack"]


@pytest.mark.broker
@pytest.mark.timeout(120)
def test_quick_transport_bench_measures_goodput_and_exactly_once_recovery(stack: Any) -> None:
    cfg = replace(bench.BenchConfig.quick(), compare_pika=True, stripes=(1, 3))
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

    points = {(r["rate_mbit"], r["payload_bytes"], r["stripes"]) for r in result["goodput"]}
    assert points == {(rate, size * bench.MIB, k) for rate in cfg.rates_mbit for size in cfg.sizes_mib
                      for k in cfg.stripes}  # striped over three queues too: every message once
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

    # Plain pika beside ours, same queue and consumer: every message of both arrived, once.
    assert [r["payload_bytes"] for r in result["compare_pika"]] == [4 * bench.MIB, cfg.small_bytes]
    for r in result["compare_pika"]:
        for who in ("windowed", "blocking", "pika"):
            assert r[who]["missing"] == 0 and r[who]["duplicates"] == 0 and r[who]["MBps"] > 0
        assert r["ratio"] == pytest.approx(r["windowed"]["MBps"] / r["pika"]["MBps"])
        assert r["blocking_ratio"] == pytest.approx(r["blocking"]["MBps"] / r["pika"]["MBps"])
    assert any(t.startswith("publisher (windowed) >= 0.9x plain pika") for t in bench.targets(result))

    rc = result["recovery"]
    assert rc["outage_s"] == cfg.cut_s and rc["measured_outage_s"] >= cfg.cut_s
    assert rc["published_during_outage"] > 0
    assert rc["arrived_during_outage"] == rc["published_during_outage"]
    assert rc["missing"] == 0 and rc["unexpected"] == 0 and rc["exactly_once"]
    # The cut overfilled the bounded upstream queue: the producer was held back, the cap held.
    assert rc["producer_waits_full"] > 0
    assert 0 < rc["upstream_max_messages"] * rc["message_bytes"] <= rc["upstream_cap_bytes"]
    first, drained = rc["heal_to_first_outage_message_s"], rc["heal_to_drained_s"]
    assert first is not None and drained is not None
    assert 0 < first <= drained < cfg.timeout_s


@pytest.mark.broker
@pytest.mark.timeout(240)
def test_goodput_over_the_kernel_shaped_namespace_link_crosses_that_link_only_once() -> None:
    """``bench transport --netns``'s measurement: brokers in two namespaces federated by hostname
    through a delaying relay, the producer and consumer here; every message arrives once and every
    byte crossed the veth."""
    import os

    from nebula_mq.bench.transport_netns import netns_goodput
    from nebula_mq.stack.netns import unusable_reason

    why = unusable_reason()
    if why:
        pytest.skip(f"namespace benchmark skipped: {why}")
    cfg = replace(bench.BenchConfig.quick(), rates_mbit=(100.0,), sizes_mib=(1,), min_messages=8, delay_ms=20.0)
    [row] = netns_goodput(cfg, f"tn{os.getpid()}")  # the delay: a relay in front of each broker
    assert (row["rate_mbit"], row["payload_bytes"], row["delay_ms"]) == (100.0, bench.MIB, 20.0)
    assert row["messages"] == cfg.goodput_messages(100.0, 1)
    assert row["missing"] == 0 and row["duplicates"] == 0
    # The token bucket lets no more through than its rate (headers count too), and the bytes
    # crossed the shaped link between the namespaces, not a path around it.
    assert 0 < row["mbit"] <= 100.0
    assert row["link_tx_bytes"] >= row["messages"] * row["payload_bytes"]


@pytest.mark.broker
# Two runs, each at most warmup (1 s) + outage (2 s) + the bench's own 30 s drain timeout, plus
# provisioning: a stall ends with the bench's result (missing > 0), not with pytest's timeout.
@pytest.mark.timeout(120)
def test_quick_recovery_bench_after_a_reset_cut_and_after_a_drop(stack: Any) -> None:
    """``bench transport --quick --recovery``: a resetting cut and a non-resetting drop, side by
    side. Both lose nothing and repeat nothing the consumer keeps; the drop resets no link (the
    relays accept no new connection), the cut does. Behaviour, not speed."""
    from nebula_mq.bench.transport_report import render_recovery
    from nebula_mq.bench.transport_recovery import recovery_grid, summarize

    cfg = replace(bench.BenchConfig.quick(), timeout_s=30.0)
    assert cfg.recovery_kinds == ("reset", "drop") and cfg.recovery_outages_s == (2.0,)
    job = stack.new_job(flows=(bench.RECOVERY_FLOW,), identities=bench.IDENTITIES, prefix="tq",
                        max_queue_bytes=cfg.recovery_cap_mib * bench.MIB)
    try:
        runs = recovery_grid(stack.stack, job, cfg)
    finally:
        stack.clean_wan()
    rows = summarize(runs)
    print(render_recovery(rows, cfg))
    assert [r["kind"] for r in runs] == ["reset", "drop"]
    for r in runs:
        assert r["outage_s"] == 2.0 and r["measured_outage_s"] >= 2.0 and r["published_during_outage"] > 0
        assert r["arrived_during_outage"] == r["published_during_outage"]
        assert r["missing"] == 0 and r["unexpected"] == 0 and r["exactly_once"]
        assert r["heal_to_first_message_s"] is not None and r["heal_to_drained_s"] is not None
        assert 0 <= r["heal_to_first_message_s"] <= r["heal_to_drained_s"]
    reset, drop = runs
    # Counted by the brokers for this job's vhost only: other jobs on the session stack do not count.
    assert reset["link_reconnects"] > 0  # the cut reset the federation links; they came back
    assert drop["link_reconnects"] == 0  # the drop (shorter than the heartbeat) reset nothing
    assert [(r["kind"], r["outage_s"], r["exactly_once"]) for r in rows] == [("reset", 2, True), ("drop", 2, True)]


@pytest.mark.broker
# Namespaces and two brokers (about 40 s), then two runs of at most warmup + outage + the bench's
# own 30 s drain timeout: a stall ends with the bench's result, not with pytest's timeout.
@pytest.mark.timeout(240)
def test_a_drop_in_the_kernel_resets_nothing_and_loses_nothing() -> None:
    """``bench transport --recovery --netns``: the kernel link between two namespaced brokers set
    down for 2 s (TCP's retransmission timeout capped, as docs/deployment.md advises for a WAN), beside
    the relay's resetting cut on the same hosts. Both lose nothing and repeat nothing; the drop
    resets no federation link, the cut resets them. Behaviour, not speed."""
    import os

    from nebula_mq.bench.transport_netns import RTO_MAX_SYSCTL, link_down_recovery
    from nebula_mq.stack.netns import unusable_reason

    why = unusable_reason() or ("" if RTO_MAX_SYSCTL.exists() else "no net.ipv4.tcp_rto_max_ms (Linux < 6.15)")
    if why:
        pytest.skip(f"namespace benchmark skipped: {why}")
    cfg = replace(bench.BenchConfig.quick(), timeout_s=30.0)
    runs = link_down_recovery(cfg, f"tk{os.getpid()}", rto_max_ms=1000)
    assert [r["kind"] for r in runs] == ["reset", "drop"]
    for r in runs:
        assert r["published_during_outage"] > 0 and r["arrived_during_outage"] == r["published_during_outage"]
        assert r["missing"] == 0 and r["unexpected"] == 0 and r["exactly_once"]
        assert r["heal_to_first_message_s"] is not None and 0 <= r["heal_to_first_message_s"] <= r["heal_to_drained_s"]
    reset, drop = runs
    assert reset["link_reconnects"] > 0 and drop["link_reconnects"] == 0
