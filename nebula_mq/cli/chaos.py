"""``nebula-mq chaos JOB.toml``: the job under faults, compared with a clean run."""

from __future__ import annotations

import argparse
from typing import Any

from nebula_mq.chaos.soak import FAULT_KINDS
from nebula_mq.cli.options import STARTED_STACK_HELP, add_stack_option, default_stack, seconds_list


def register(sub: Any) -> None:
    p = sub.add_parser("chaos", help="run a job under WAN cuts, broker restarts, SIGKILLs and stalls")
    p.add_argument("config", help="job TOML file")
    add_stack_option(p, STARTED_STACK_HELP, default_stack())
    p.add_argument("--cuts", default="5,10,20,30,60", type=seconds_list,
                   help="WAN cut lengths in seconds, comma separated (default 5,10,20,30,60)")
    p.add_argument("--stall", type=float, default=120.0, help="seconds a consumer is frozen")
    p.add_argument("--rotate", action="store_true",
                   help="also rotate a worker's certificate and its broker's mid-run, revoking the old ones")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds each of the two runs (clean, then under faults) may take")
    soak = p.add_argument_group("soak", "run the job for a set time under random faults and judge the "
                                        "trends of memory, descriptors, queues, dead letters and step rate")
    soak.add_argument("--soak", type=_positive, metavar="MINUTES", help="soak for this many minutes")
    soak.add_argument("--seed", type=int, default=0, help="seed of the random fault schedule (default 0)")
    soak.add_argument("--fault-every", type=_positive, default=30.0, metavar="SECONDS",
                      help="mean seconds between faults (default 30)")
    soak.add_argument("--sample-every", type=_positive, default=10.0, metavar="SECONDS",
                      help="seconds between samples (default 10)")
    soak.add_argument("--faults", type=_fault_kinds, default=FAULT_KINDS, metavar="KINDS",
                      help=f"comma-separated fault kinds (default {','.join(FAULT_KINDS)})")
    p.set_defaults(func=_chaos)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _fault_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"fault kinds are {', '.join(FAULT_KINDS)}; got {text!r}")
    return kinds


def _soak(args: argparse.Namespace) -> int:
    from nebula_mq.chaos.soak import Soak, SoakOptions, format_soak

    options = SoakOptions(args.soak, args.seed, args.sample_every, args.fault_every, args.faults)
    report = Soak(args.config, args.stack, options).run()
    print(format_soak(report))
    return 0 if report.ok else 1


def _chaos(args: argparse.Namespace) -> int:
    from nebula_mq.chaos import ChaosRunner, default_schedule, format_report
    from nebula_mq.launch import JobProcesses
    from nebula_mq.runtime.logs import configure_logging

    configure_logging("warning")
    if args.soak:
        return _soak(args)
    job = JobProcesses(args.config, args.stack)
    procs = job.plan.processes
    clusters = (procs[-1].cluster, procs[0].cluster)
    workers = (procs[-1].worker_id, procs[0].worker_id)
    schedule = default_schedule(job.settings.job.steps, clusters, workers, args.cuts, args.stall,
                                rotate=args.rotate)
    report = ChaosRunner(args.config, args.stack, schedule).run(args.timeout)
    print(format_report(report))
    return 0 if report.identical and report.complete else 1
