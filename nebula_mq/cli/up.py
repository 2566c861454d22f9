"""``nebula-mq up JOB.toml --cluster NAME``: this host's part of a job, in one command.

A cluster is a broker host and the hosts of its ranks. On each host, after its stack is up
(``nebula-mq stack up --clusters NAME --hostname H`` for a broker the other cluster reaches)
and trusts the peer (``nebula-mq stack trust``), ``up``:

1. joins the job (``stack.joining.join``): on the broker host, checks the peers are trusted
   and reads their CRLs, provisions the job on this host's broker (idempotent), and shares the
   job key and job file over the brokers, sealed: the first cluster by name sends them, the
   others wait for them and compare the job file with their own;
2. starts this host's workers of that cluster (all of them, or the ranks ``--ranks`` names:
   the others run on other hosts of the cluster) against the stack's broker;
3. supervises them with ``run``'s restart policy (a worker that dies is restarted with its
   group), forwards Ctrl-C and SIGTERM as SIGTERM (each worker checkpoints and exits 0),
   reads the peers' CRLs again every hour, and exits when the workers have: running ``up``
   again resumes from the checkpoints.

On a host of the cluster without its broker, ``up --ranks I --broker-host NAME`` waits in 1 for
the key the broker host's ``up`` writes on the filesystem the cluster's hosts share (stack
directory and run_dir), and this host's workers reach the broker by ``NAME``. On a stack that
holds every cluster of the job (one machine), ``up --cluster`` runs that cluster's part, and
``run`` the whole job.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nebula_mq.cli.options import add_stack_option, default_stack
from nebula_mq.cli.run import DEFAULT_RESTARTS, positive_seconds


def register(sub: Any) -> None:
    p = sub.add_parser("up", help="this host's part of a job: provision its cluster's broker, start and supervise "
                                  "its workers (run it again to resume)")
    p.add_argument("config", metavar="JOB.toml", help="the job file")
    p.add_argument("--cluster", required=True, metavar="NAME", help="the cluster this host belongs to")
    add_stack_option(p, "this host's stack directory, its broker up (default $NEBULA_RUN_DIR or run/stack)",
                     default_stack())
    p.add_argument("--ranks", type=ranks_list, default=None, metavar="I,J,...",
                   help="only these rank indices of the cluster's roles (the others run on other hosts); "
                        "default: every worker of the cluster")
    p.add_argument("--broker-host", default="", metavar="NAME",
                   help="this host runs ranks only: the cluster's broker runs on NAME (a name in its certificate), "
                        "whose `up` provisions the job; the stack directory and the job's run_dir are on a "
                        "filesystem this host shares with it")
    p.add_argument("--timeout", type=positive_seconds, default=None, help="give up after this many seconds")
    p.add_argument("--max-restarts", "--restarts", dest="restarts", type=int, default=DEFAULT_RESTARTS, metavar="N",
                   help=f"restart a worker that dies on its own at most N times in all (default {DEFAULT_RESTARTS})")
    p.set_defaults(func=_up)


def ranks_list(text: str) -> frozenset[int]:
    """argparse type of ``--ranks``: comma-separated rank indices >= 0, echoing a bad value."""
    try:
        ranks = frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rank indices like 0,1, got {text!r}") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"expected rank indices >= 0 like 0,1, got {text!r}")
    return ranks


def _up(args: argparse.Namespace) -> int:
    from nebula_mq.cli.run import start_workers, supervise_job
    from nebula_mq.errors import ConfigError
    from nebula_mq.launch import JobProcesses
    from nebula_mq.launch.supervisor import Periodic
    from nebula_mq.runtime.logs import configure_logging
    from nebula_mq.stack import Stack
    from nebula_mq.stack.joining import CRL_REFRESH_S, join
    from nebula_mq.stack.layout import did_you_mean
    from workers.plans import plan_for
    from workers.registry import load_job_settings, scenario_of

    configure_logging("info")

    def mine(p: Any) -> bool:
        return bool(p.cluster == args.cluster and (args.ranks is None or p.cluster_rank in args.ranks))

    plan = plan_for(load_job_settings(args.config))  # this host's part is checked before any stack is read
    clusters = sorted({p.cluster for p in plan.processes})
    if args.cluster not in clusters:
        raise ConfigError("<command line>", "--cluster", f"a cluster of the job's workers ({', '.join(clusters)})"
                          f"{did_you_mean(args.cluster, clusters)}", args.cluster)
    if not any(mine(p) for p in plan.processes):
        indices = sorted({p.cluster_rank for p in plan.processes if p.cluster == args.cluster})
        raise ConfigError("<command line>", "--ranks", f"ranks of {args.cluster}'s roles ({indices})",
                          ",".join(map(str, sorted(args.ranks or ()))))
    job = JobProcesses(args.config, args.stack, select=mine, broker_host=args.broker_host, command_name="up")
    job.claim_all()  # a rank running already, or placed on another host: refused before anything
    refresh = join(job.settings, job.plan, args.cluster, Stack.open(args.stack), args.broker_host,
                   scenario_of(job.settings).section, say=_say)
    start_workers(job)
    return supervise_job(job, args.timeout, args.restarts, () if refresh is None else (Periodic(CRL_REFRESH_S, refresh),))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


