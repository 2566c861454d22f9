"""``nebula-mq chaos JOB.toml``: the job under faults, compared with a clean run."""

from __future__ import annotations

import argparse
from typing import Any

from nebula_mq.cli.options import add_stack_option, default_stack, seconds_list


def register(sub: Any) -> None:
    p = sub.add_parser("chaos", help="run a job under WAN cuts, broker restarts, SIGKILLs and stalls")
    p.add_argument("config", help="job TOML file")
    add_stack_option(p, "local stack directory, started if needed (default $NEBULA_RUN_DIR or run/stack)",
                     default_stack())
    p.add_argument("--cuts", default="5,10,20,30,60", type=seconds_list,
                   help="WAN cut lengths in seconds, comma separated (default 5,10,20,30,60)")
    p.add_argument("--stall", type=float, default=120.0, help="seconds a consumer is frozen")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds each of the two runs (clean, then under faults) may take")
    p.set_defaults(func=_chaos)


def _chaos(args: argparse.Namespace) -> int:
    from nebula_mq.chaos import ChaosRunner, default_schedule, format_report
    from nebula_mq.launch import JobProcesses
    from nebula_mq.runtime.logs import configure_logging

    configure_logging("warning")
    job = JobProcesses(args.config, args.stack)
    procs = job.plan.processes
    clusters = (procs[-1].cluster, procs[0].cluster)
    workers = (procs[-1].worker_id, procs[0].worker_id)
    schedule = default_schedule(job.settings.job.steps, clusters, workers, args.cuts, args.stall)
    report = ChaosRunner(args.config, args.stack, schedule).run(args.timeout)
    print(format_report(report))
    return 0 if report.identical and report.complete else 1
