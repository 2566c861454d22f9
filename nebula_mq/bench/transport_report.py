"""What ``nebula-mq bench transport`` reports: the machine and the stack it measured, the tables
of a run's result (``transport.run_bench``), and which targets the figures meet."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from nebula_mq.bench.runs import cpu_model
from nebula_mq.bench.transport_runs import A, B, MIB, BenchConfig
from nebula_mq.errors import NebulaError


def machine_facts(stack: Any) -> dict[str, Any]:
    """The machine and the software the figures were measured with (RabbitMQ's, as ``stack`` runs it)."""
    try:
        rabbit = stack.rabbitmqctl(A, "version").strip()
    except NebulaError as exc:
        rabbit = f"unknown ({exc})"
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "load_avg_1_5_15": list(os.getloadavg()),
            "python": platform.python_version(), "pika": metadata.version("pika"), "rabbitmq": rabbit,
            "kernel": platform.release()}


def stack_facts(stack: Any, cfg: BenchConfig) -> dict[str, Any]:
    """How the stack under test carries the messages: TLS, relay, federation, queues."""
    from nebula_mq.stack import provision, relay

    return {"clusters": list(stack.clusters), "tls": "TLS 1.2/1.3, certificate login (EXTERNAL)",
            "relay": {"shaped_rates_mbit": list(cfg.rates_mbit), "delay_ms_each_way": cfg.delay_ms,
                      "chunk_bytes": relay.CHUNK, "burst_s": relay.BURST_S},
            "federation": {"type": "queue federation", "ack_mode": provision.ACK_MODE,
                           "prefetch_count": provision.PREFETCH, "reconnect_delay_s": provision.RECONNECT_DELAY_S},
            "queues": "classic durable lazy, persistent messages, publisher confirms, manual acks",
            "messages": "nebula_mq.wire envelopes, one fp32 tensor, codec none (payload = tensor bytes)",
            "publisher_threads": cfg.publishers, "small_publisher_threads": cfg.small_publishers}


def size_text(n: int) -> str:
    """``n`` bytes, in the largest of MiB, KiB and B that holds it whole."""
    return f"{n // MIB} MiB" if n >= MIB else f"{n // 1024} KiB" if n >= 1024 else f"{n} B"


def render(result: dict[str, Any]) -> str:
    """The tables a run prints: goodput, unshaped rates, ours beside plain pika, recovery."""
    cfg, m, st = result["config"], result["machine"], result["stack"]
    lines = [f"machine: {m['cpu']}, {m['cores']} cores, load {m['load_avg_1_5_15'][0]:.2f} at start, "
             f"Python {m['python']}, pika {m['pika']}, RabbitMQ {m['rabbitmq']}",
             f"stack: {', '.join(st['clusters'])}; {st['tls']}; {st['federation']['type']}, ack-mode "
             f"{st['federation']['ack_mode']}, link prefetch {st['federation']['prefetch_count']}; {st['queues']}",
             f"messages: {st['messages']}; {cfg['publishers']} publisher threads (one connection each)", "",
             f"goodput across the federated TLS link, shaped by the relay (+{cfg['delay_ms']:g} ms each way);",
             f"first publish -> last message consumed on {B}, payload bytes; median of {cfg['repeats']}",
             f"{'link Mbit/s':>11} {'size':>7} {'stripes':>7} {'msgs':>5} {'Mbit/s':>7} {'% link':>7} "
             f"{'steady %':>9} {'runs (Mbit/s)':>24} {'dup':>4} {'miss':>4} {'vs 1 stripe':>11}"]
    one = {(r["rate_mbit"], r["payload_bytes"]): r for r in result["goodput"] if r.get("stripes", 1) == 1}
    for r in result["goodput"]:
        base = one.get((r["rate_mbit"], r["payload_bytes"]))
        vs = f"{r['mbit'] / base['mbit']:10.2f}x" if base and r is not base and base["mbit"] > 0 else f"{'':>11}"
        lines.append(f"{r['rate_mbit']:11g} {size_text(r['payload_bytes']):>7} {r.get('stripes', 1):7d} "
                     f"{r['messages']:5d} {r['mbit']:7.1f} {r['percent']:7.1f} {r['steady_percent']:9.1f} "
                     f"{str(r['all_mbit']):>24} {r['duplicates']:4d} {r['missing']:4d} {vs}")
    lines += ["", "unshaped (relay unlimited, no delay); MB = 10^6 bytes",
              f"{'path':>11} {'size':>7} {'msgs':>5} {'MB/s':>7} {'msgs/s':>8} {'dup':>4} {'miss':>4}"]
    for r in result["unshaped"]:
        lines.append(f"{r['path']:>11} {size_text(r['payload_bytes']):>7} {r['messages']:5d} {r['MBps']:7.1f} "
                     f"{r['msgs_s']:8.0f} {r['duplicates']:4d} {r['missing']:4d}")
    if result.get("compare_pika"):
        lines += ["", "publisher beside plain pika (BlockingConnection, confirm_delivery, one basic_publish per "
                      "message), one thread each, same TLS, same broker, same consumer; medians. Ours windowed: "
                      "publish_async, then flush (the runtime's outboxes); ours one at a time: publish",
                  f"{'size':>7} {'msgs':>5} {'windowed MB/s':>14} {'msgs/s':>8} {'1-at-a-time MB/s':>17} "
                  f"{'pika MB/s':>10} {'pika msgs/s':>12} {'windowed/pika':>14} {'1-at-a-time/pika':>17}"]
        for r in result["compare_pika"]:
            o, b, k = r["windowed"], r["blocking"], r["pika"]
            lines.append(f"{size_text(r['payload_bytes']):>7} {r['messages']:5d} {o['MBps']:14.1f} {o['msgs_s']:8.0f} "
                         f"{b['MBps']:17.1f} {k['MBps']:10.1f} {k['msgs_s']:12.0f} {r['ratio']:14.2f} "
                         f"{r['blocking_ratio']:17.2f}")
    rc = result["recovery"]
    first, drained = rc["heal_to_first_outage_message_s"], rc["heal_to_drained_s"]
    lines += ["", f"recovery: WAN cut {rc['measured_outage_s']:.1f} s at {rc['rate_mbit']:g} Mbit/s +{rc['delay_ms']:g} ms; "
              f"{size_text(rc['message_bytes'])} messages at {rc['pace_msgs_s']:g}/s, upstream cap {size_text(rc['upstream_cap_bytes'])}",
              f"  published {rc['published']} ({rc['published_during_outage']} during the cut); upstream queue peaked at "
              f"{rc['upstream_max_messages']} msgs; producer nacked {rc['producer_waits_full']}x, "
              f"waited {rc['producer_waited_s']:.1f} s",
              f"  heal -> first cut-time message downstream: {'%.2f s' % first if first is not None else 'never'}; "
              f"heal -> drained: {'%.2f s' % drained if drained is not None else 'not drained'}",
              f"  exactly once: {rc['arrived_during_outage']}/{rc['published_during_outage']} cut-time messages arrived, "
              f"{rc['missing']} missing, {rc['unexpected']} unexpected, {rc['duplicates_discarded']} duplicates "
              f"discarded by message id -> {'OK' if rc['exactly_once'] else 'FAILED'}"]
    return "\n".join(lines)


def targets(result: dict[str, Any]) -> list[str]:
    """Each target of the transport, met or MISSED, with the figure that decides it."""
    out = []
    for r in result["goodput"]:
        if r["payload_bytes"] >= 4 * MIB:
            ok = r["percent"] >= 90
            stripes = r.get("stripes", 1)
            out.append(f"goodput >= 90% at {r['rate_mbit']:g} Mbit/s, {size_text(r['payload_bytes'])}"
                       f"{f', {stripes} stripes' if stripes > 1 else ''}: {'met' if ok else 'MISSED'} "
                       f"({r['percent']:.1f}%)")
    out.append(f"recovery exactly once: {'met' if result['recovery']['exactly_once'] else 'MISSED'}")
    for r in result.get("compare_pika", []):
        out.append(f"publisher (windowed) >= 0.9x plain pika, {size_text(r['payload_bytes'])}: "
                   f"{'met' if r['ratio'] >= 0.9 else 'MISSED'} ({r['ratio']:.2f}x; one at a time "
                   f"{r['blocking_ratio']:.2f}x)")
    return out


RELAY_KINDS = ("reset: the relay's cut (every connection reset, new ones refused); drop: a blackhole (nothing crosses, "
               "nothing is reset, new connections unanswered)")
LINK_DOWN_KINDS = ("reset: the relay's cut in front of each broker (every connection reset, new ones refused); drop: the "
                   "kernel link between the namespaces set down (packets lost, nothing reset)")


def render_recovery(rows: list[dict[str, Any]], cfg: BenchConfig, kinds: str = RELAY_KINDS) -> str:
    """``--recovery``'s table: per one-way delay and outage length, each kind's medians side by side."""

    def s(x: float | None) -> str:
        return "never" if x is None else f"{x:.2f}"

    lines = [f"recovery after a WAN outage at {cfg.recovery_rate_mbit:g} Mbit/s: {size_text(cfg.recovery_message_kib * 1024)} "
             f"messages at {cfg.recovery_pace:g}/s, upstream cap {cfg.recovery_cap_mib} MiB; medians of {cfg.repeats}",
             kinds,
             "seconds after the heal: first message (any), first message published during the outage (during), backlog "
             "drained (back in step with the producer); reconn: this job's federation links reconnected, per run",
             f"{'delay':>6} {'outage':>6} {'RTT':>5} {'kind':>6} {'first':>6} {'RTTs':>5} {'during':>8} {'drained':>8} "
             f"{'reconn':>9} {'once':>5}  runs (first, s)"]
    for r in rows:
        rtts = "" if r["first_message_rtts"] is None else f"{r['first_message_rtts']:.1f}"
        runs = ", ".join(s(x) for x in r["all_first_message_s"])
        lines.append(f"{r['delay_ms']:4g}ms {r['outage_s']:5g}s {r['rtt_s']:5.2f} {r['kind']:>6} "
                     f"{s(r['first_message_s']):>6} {rtts:>5} {s(r['first_outage_message_s']):>8} "
                     f"{s(r['drained_s']):>8} {','.join(map(str, r['link_reconnects'])):>9} "
                     f"{'OK' if r['exactly_once'] else 'FAIL':>5}  {runs}")
    return "\n".join(lines)


def compare_emulations(relay: Sequence[dict[str, Any]], netns: Sequence[dict[str, Any]]) -> list[str]:
    """The two WAN emulations side by side: goodput as a share of the link, and their ratio."""
    def point(r: dict[str, Any]) -> tuple[float, int, int]:
        return r["rate_mbit"], r["payload_bytes"], r.get("stripes", 1)

    by_point = {point(r): r for r in relay}
    lines = [f"{'link Mbit/s':>11} {'size':>7} {'stripes':>7} {'relay %':>8} {'kernel %':>9} {'kernel/relay':>13}"]
    for n in netns:
        r = by_point.get(point(n))
        rp = f"{r['percent']:8.1f}" if r else f"{'-':>8}"
        ratio = f"{n['percent'] / r['percent']:13.2f}" if r and r["percent"] > 0 else f"{'-':>13}"
        lines.append(f"{n['rate_mbit']:11g} {n['payload_bytes'] // MIB:5d} M {n.get('stripes', 1):7d} {rp} "
                     f"{n['percent']:9.1f} {ratio}")
    return lines
