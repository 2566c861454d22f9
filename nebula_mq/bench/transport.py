"""``nebula-mq bench transport``: what the RabbitMQ transport delivers across the emulated WAN.

One run, on a TLS stack of its own (or ``--stack``), with its own job (fresh id,
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

With ``--recovery`` it only measures recovery, for both kinds of outage side by side (the
relay's resetting cut and a drop that resets nothing), at several one-way delays and outage
lengths, medians of ``--repeats`` (``transport_recovery.recovery_grid``); with ``--netns`` as
well, over the kernel link between two namespaced brokers (``transport_netns``).

Library use (the integration test): provision a job with ``throughput_flows(cfg)`` and
``IDENTITIES``, and a second job for ``RECOVERY_FLOW`` (see ``recovery``), then
``run_bench(stack, job, recovery_job, cfg)``; ``transport_report`` prints the result and
judges its targets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from nebula_mq import topology
from nebula_mq.bench.runs import bench_stack, delete_vhosts
from nebula_mq.bench.transport_netns import RTO_MAX_SYSCTL
from nebula_mq.bench.transport_recovery import recovery, recovery_grid, summarize
from nebula_mq.bench.transport_report import (LINK_DOWN_KINDS, compare_emulations, machine_facts, render,
                                              render_recovery, size_text, stack_facts, targets)
from nebula_mq.bench.transport_runs import (A, B, COMPARED, IDENTITIES, MIB, RECOVERY_FLOW, BenchConfig, BenchJob,
                                            StackJob, Transfer, compare_flow, goodput_points, median_transfer,
                                            throughput_flows, transfer)
from nebula_mq.errors import ConfigError, NebulaError
from nebula_mq.topology import Flow


def run_bench(stack: Any, job: BenchJob, recovery_job: BenchJob, cfg: BenchConfig,
              say: Callable[[str], None] = print) -> dict[str, Any]:
    """All measurements on a running ``stack``: ``job`` is provisioned with
    ``throughput_flows(cfg)``, ``recovery_job`` as ``recovery`` says.

    Leaves the WAN healed; the caller restores its shape.
    """
    result: dict[str, Any] = {"config": asdict(cfg), "unshaped": [], "goodput": []}
    stack.link_up(None, rate_mbit=0, delay_ms=0)
    # (flow name, payload, messages, publishers): the large sizes, then the small messages
    large = [(str(s), s * MIB, max(cfg.min_messages, cfg.unshaped_mib // s), cfg.publishers)
             for s in cfg.unshaped_sizes_mib]
    small = ("small", cfg.small_bytes, cfg.small_messages, cfg.small_publishers)
    for path, dst in (("loopback", A), ("federation", B)):
        for name, payload, n, publishers in [*large, small]:
            r = transfer(job, Flow(f"{'lo' if dst == A else 'wan'}-{name}", A, dst), payload, n, publishers,
                         cfg.timeout_s)
            row = {"path": path, **median_transfer([r]), "MBps": r.mbit / 8, "msgs_s": n / r.elapsed_s}
            result["unshaped"].append(row)
            say(f"  unshaped {path:10s} {size_text(payload):>7} x {n:4d}: {row['MBps']:7.1f} MB/s, "
                f"{row['msgs_s']:7.0f} msgs/s")
    result["goodput"] = goodput_points(
        job, cfg, lambda rate: stack.link_up(None, rate_mbit=rate, delay_ms=cfg.delay_ms), "goodput", say)
    if cfg.compare_pika:
        result["compare_pika"] = compare_pika(job, cfg, say)
    say(f"  recovery: cutting the WAN for {cfg.cut_s:g} s ...")
    result["recovery"] = recovery(stack, recovery_job, cfg)
    return result


def compare_pika(job: BenchJob, cfg: BenchConfig, say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Our publisher, windowed (as the runtime's outboxes publish) and one confirm at a time, and
    a plain pika publisher (``transport.reference``), one thread each, into a queue of one broker
    drained by the same consumer; repeats interleaved. One row per size: medians of each, and ours
    over pika's for both of ours."""
    rows = []
    for size in (*cfg.compare_sizes_mib, 0):
        payload = size * MIB if size else cfg.small_bytes
        n = max(cfg.min_messages, cfg.compare_mib // size) if size else cfg.compare_small_messages
        runs: dict[str, list[Transfer]] = {who: [] for who in COMPARED}
        for k in range(cfg.repeats):
            for who in COMPARED:
                runs[who].append(transfer(job, compare_flow(size, k, who), payload, n, 1, cfg.timeout_s,
                                          plain_pika=who == "pika", windowed=who == "windowed"))
        row: dict[str, Any] = {"payload_bytes": payload, "messages": n, "repeats": cfg.repeats}
        for who, rs in runs.items():
            med = median_transfer(rs)
            row[who] = {"MBps": med["mbit"] / 8, "msgs_s": n / med["elapsed_s"], "missing": med["missing"],
                        "duplicates": med["duplicates"]}
        row["ratio"] = row["windowed"]["MBps"] / row["pika"]["MBps"]
        row["blocking_ratio"] = row["blocking"]["MBps"] / row["pika"]["MBps"]
        rows.append(row)
        say(f"  compare-pika {size_text(payload):>7} x {n:4d}: windowed {row['windowed']['MBps']:7.1f} MB/s "
            f"({row['windowed']['msgs_s']:6.0f} msgs/s), one at a time {row['blocking']['MBps']:7.1f} MB/s, "
            f"plain pika {row['pika']['MBps']:7.1f} MB/s ({row['pika']['msgs_s']:6.0f} msgs/s): "
            f"{row['ratio']:.2f}x windowed, {row['blocking_ratio']:.2f}x one at a time")
    return rows


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", "--run-dir", dest="stack", metavar="DIR",
                        help="use the stack in this directory (started if down) instead of a fresh one")
    parser.add_argument("--repeats", type=int, help="repeats of each goodput point (default 3, quick 1)")
    parser.add_argument("--cut-s", type=float, help="seconds the WAN stays cut (default 30, quick 5)")
    parser.add_argument("--rates", type=_listed(float), metavar="MBIT,...",
                        help="shaped link rates (default 60,170; quick 170)")
    parser.add_argument("--sizes", type=_listed(int), metavar="MIB,...", help="goodput message sizes (default 1,4,8,16)")
    parser.add_argument("--delay-ms", type=float, help="delay the relay adds each way (default 20)")
    parser.add_argument("--stripes", type=_listed(int), metavar="K,...",
                        help="measure each goodput point with the flow striped over each of these numbers of "
                             "queues, one federation link each (default 1), side by side")
    parser.add_argument("--compare-pika", action="store_true",
                        help="also time a plain pika publisher with confirms beside ours, one thread each, over the "
                             "same TLS into the same broker, and print ours over pika's")
    parser.add_argument("--recovery", action="store_true",
                        help="only recovery: heal -> first message and -> drained after a resetting cut and after a "
                             "drop that resets nothing, side by side, at each --recovery-delays and --outages")
    parser.add_argument("--recovery-delays", type=_listed(float), metavar="MS,...",
                        help="--recovery: one-way delays (default 0,20,200; quick 20)")
    parser.add_argument("--outages", type=_listed(float), metavar="S,...",
                        help="--recovery: outage lengths, shorter and longer than the links' heartbeat timeout "
                             "(default 5,45; quick 2)")
    parser.add_argument("--netns", action="store_true",
                        help="also measure the goodput points over a kernel-shaped link between two network "
                             "namespaces (brokers federated by hostname; needs root), beside the relay's; with "
                             "--recovery, the grid over that link, its drop the link set down")
    parser.add_argument("--rto-max-ms", type=int, metavar="MS", default=None,
                        help="--recovery --netns: cap TCP's retransmission timeout on both broker hosts "
                             "(net.ipv4.tcp_rto_max_ms, Linux 6.15+), as an operator would on a WAN")


def _listed(kind: type[float] | type[int]) -> Callable[[str], tuple[Any, ...]]:
    """An argparse type: ``a,b,c`` as a tuple of ``kind``."""
    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            what = "integers" if kind is int else "numbers"
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
    return parse


def check_flags(args: argparse.Namespace) -> None:
    """Refuse, before any stack starts, values out of range and flags the chosen mode would ignore."""
    def bad(flag: str, expected: str, got: object = None) -> ConfigError:
        return ConfigError("bench transport", flag, expected, got)

    if any(d < 0 for d in args.recovery_delays or ()):
        raise bad("--recovery-delays", "one-way delays >= 0 ms", ",".join(f"{d:g}" for d in args.recovery_delays))
    for flag in ("recovery_delays", "outages"):
        if not args.recovery and getattr(args, flag):
            raise bad(f"--{flag.replace('_', '-')}", "--recovery beside it (only the recovery grid reads it)")
    if any(s <= 0 for s in args.outages or ()):
        raise bad("--outages", "outage lengths > 0 seconds", ",".join(f"{s:g}" for s in args.outages))
    if not all(1 <= k <= topology.MAX_STRIPES for k in args.stripes or ()):
        raise bad("--stripes", f"stripe counts in 1..{topology.MAX_STRIPES}", ",".join(map(str, args.stripes)))
    rto = args.rto_max_ms
    if rto is not None and not (args.recovery and args.netns):
        raise bad("--rto-max-ms", "--recovery --netns beside it (it tunes the namespaced hosts' TCP)")
    if rto is not None and not 1000 <= rto <= 120000:  # the kernel's own bounds for the sysctl
        raise bad("--rto-max-ms", "milliseconds in 1000..120000", rto)
    if rto is not None and not RTO_MAX_SYSCTL.exists():
        raise bad("--rto-max-ms", "Linux 6.15 or later (net.ipv4.tcp_rto_max_ms)", f"{platform.release()}")
    if args.recovery and args.netns and args.stack:
        raise bad("--stack", "no --recovery --netns (that grid makes its own namespaced brokers)")
    if args.recovery and args.compare_pika:
        raise bad("--compare-pika", "no --recovery (the recovery grid measures no goodput)")


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """The configuration the flags ask for, over the defaults (``--quick``: the smaller ones)."""
    given = {"repeats": args.repeats, "cut_s": args.cut_s, "rates_mbit": args.rates, "sizes_mib": args.sizes,
             "stripes": args.stripes, "compare_pika": args.compare_pika, "recovery_delays_ms": args.recovery_delays,
             "recovery_outages_s": args.outages}
    cfg = replace(BenchConfig.quick() if args.quick else BenchConfig(), **{k: v for k, v in given.items() if v})
    return cfg if args.delay_ms is None else replace(cfg, delay_ms=args.delay_ms)


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    cfg = bench_config(args)
    mode = _link_down if args.recovery and args.netns else _recovery if args.recovery else _everything
    job_id = f"bench-{os.getpid()}-{int(time.time())}"
    try:  # also a stack that fails to start
        result, table = mode(args, cfg, job_id)
    except ConfigError:
        raise
    except NebulaError as exc:
        print(f"bench transport failed: {exc}")
        return 1
    print(table)
    print(f"wall time {result['wall_s']:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
        print(f"wrote {args.json}")
    return 0 if all(r["exactly_once"] for r in result.get("runs", [result["recovery"]])) else 1


def _everything(args: argparse.Namespace, cfg: BenchConfig, job_id: str) -> tuple[dict[str, Any], str]:
    """Every measurement (``run_bench``) on the relay's WAN; with ``--netns``, the goodput points
    over the kernel's too. The result and its tables."""
    jobs = (job_id, f"{job_id}-r")
    with bench_stack(args.stack) as (stack, started):
        try:
            stack.provision_job(jobs[0], throughput_flows(cfg), IDENTITIES)
            stack.provision_job(jobs[1], (RECOVERY_FLOW,), IDENTITIES, max_queue_bytes=cfg.recovery_cap_mib * MIB)
            result: dict[str, Any] = {"machine": machine_facts(stack), "stack": stack_facts(stack, cfg),
                                      "job_ids": list(jobs)}
            t0 = time.monotonic()
            result.update(run_bench(stack, StackJob(stack, jobs[0]), StackJob(stack, jobs[1]), cfg))
            if args.netns:
                from nebula_mq.bench.transport_netns import netns_goodput

                print("goodput over the kernel-shaped namespace link ...")
                result["netns_goodput"] = netns_goodput(cfg, f"{job_id}-n")
            result["wall_s"] = time.monotonic() - t0
            result["machine"]["load_avg_1_5_15_end"] = list(os.getloadavg())
        finally:
            if not started:
                delete_vhosts(stack, jobs)
    result["targets"] = targets(result)
    table = "\n" + render(result) + "\n\ntargets:\n" + "\n".join("  " + t for t in result["targets"])
    if "netns_goodput" in result:
        table += (f"\n\nthe two WAN emulations, same points, same run, +{cfg.delay_ms:g} ms each way (relay: user "
                  "space rate and delay; kernel: tc tbf rate on a veth between two network namespaces, the delay by "
                  "a relay on each host):\n" + "\n".join(compare_emulations(result["goodput"], result["netns_goodput"])))
    return result, table


def _recovery(args: argparse.Namespace, cfg: BenchConfig, job_id: str) -> tuple[dict[str, Any], str]:
    """``--recovery``: the recovery grid alone, on a stack of its own (or ``--stack``)."""
    from nebula_mq.stack import provision

    job_id += "-r"
    with bench_stack(args.stack) as (stack, started):
        try:
            stack.provision_job(job_id, (RECOVERY_FLOW,), IDENTITIES, max_queue_bytes=cfg.recovery_cap_mib * MIB)
            result: dict[str, Any] = {"machine": machine_facts(stack), "stack": stack_facts(stack, cfg),
                                      "config": asdict(cfg), "job_ids": [job_id]}
            t0 = time.monotonic()
            result["runs"] = recovery_grid(stack, StackJob(stack, job_id), cfg)
            result["wall_s"] = time.monotonic() - t0
        finally:
            if not started:  # a stack started here goes down whole
                delete_vhosts(stack, [job_id])
    result["recovery"] = summarize(result["runs"])
    m = result["machine"]
    return result, (f"\nmachine: {m['cpu']}, {m['cores']} cores, load {m['load_avg_1_5_15'][0]:.2f} at start, "
                    f"RabbitMQ {m['rabbitmq']}; federation heartbeat {provision.HEARTBEAT_S} s, reconnect delay "
                    f"{provision.RECONNECT_DELAY_S} s\n" + render_recovery(result["recovery"], cfg))


def _link_down(args: argparse.Namespace, cfg: BenchConfig, job_id: str) -> tuple[dict[str, Any], str]:
    """``--recovery --netns``: the recovery grid over the kernel link between two namespaced brokers."""
    from nebula_mq.bench.transport_netns import link_down_recovery

    t0 = time.monotonic()
    runs = link_down_recovery(cfg, f"{job_id}-k", args.rto_max_ms)
    result: dict[str, Any] = {"config": asdict(cfg), "rto_max_ms": args.rto_max_ms, "runs": runs,
                              "recovery": summarize(runs), "wall_s": time.monotonic() - t0}
    rto = (f"TCP's retransmission timeout capped at {args.rto_max_ms} ms" if args.rto_max_ms
           else "TCP as the kernel ships it")
    return result, f"\n{rto} on both broker hosts\n" + render_recovery(result["recovery"], cfg, LINK_DOWN_KINDS)
