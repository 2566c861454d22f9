"""``nebula-mq worker --role ROLE --config FILE``: one long-running worker daemon.

With ``--stack RUN_DIR`` the broker settings of the worker's cluster come from
the local stack (its TLS identity is issued there); otherwise from the job
file's ``[clusters.<name>.broker]`` table, as in a real deployment.
SIGTERM finishes the micro-batch in flight, checkpoints, acks and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from nebula_mq.settings import ClusterSettings, Settings, load_settings


def register(sub: Any) -> None:
    p = sub.add_parser("worker", help="run one worker daemon of a job")
    p.add_argument("--role", required=True, help="e.g. abnet-encoder, abnet-decoder, electra-generator")
    p.add_argument("--config", required=True, help="job TOML file")
    p.add_argument("--index", type=int, default=0, help="index among workers of the same role")
    p.add_argument("--stack", default=None, help="take broker settings from this local stack run dir")
    p.add_argument("--log-level", default="info")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="also serve Prometheus metrics over HTTP on this port (/metrics)")
    p.set_defaults(func=_run)


def resolve_from_stack(settings: Settings, stack_dir: str, role: str, index: int) -> Settings:
    """Settings whose clusters point at the local stack's nodes, for this process's identity."""
    from nebula_mq import topology
    from nebula_mq.stack import Stack
    from workers.plans import plan_for

    stack = Stack.open(stack_dir)
    proc = plan_for(settings).find(role, index)
    vhost = topology.vhost(settings.job.id)
    broker = stack.broker_settings(proc.cluster, proc.identity(settings.job.id), vhost=vhost)
    clusters = dict(settings.clusters)
    clusters[proc.cluster] = ClusterSettings(proc.cluster, broker)
    return dataclasses.replace(settings, clusters=clusters)


def _run(args: argparse.Namespace) -> int:
    from nebula_mq.runtime.logs import configure_logging
    from workers.plans import run_role

    configure_logging(args.log_level)
    if args.metrics_port:
        from nebula_mq.runtime.worker import METRICS_PORT_ENV

        os.environ[METRICS_PORT_ENV] = str(args.metrics_port)
    settings = load_settings(args.config)
    if args.stack:
        settings = resolve_from_stack(settings, args.stack, args.role, args.index)
    return run_role(args.role, settings, args.index)
