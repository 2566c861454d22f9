"""``nebula-mq run JOB.toml`` and ``nebula-mq demo``: every role of a job on this machine;
``nebula-mq up JOB.toml --cluster NAME``: this host's part of a job, in one command.

``run`` brings the local stack up (idempotent), provisions the job on it
(vhost, certificate users, federation of the job's cross-cluster flows), and
starts one ``nebula-mq worker`` process per entry of the job's plan, each on
its own cluster's broker. It waits for them, showing each worker's step.
Ctrl-C or SIGTERM is forwarded as SIGTERM: workers checkpoint and exit, and a
later ``run`` of the same job resumes from the checkpoints. A worker that dies on
its own is restarted with its group (``--restarts``, ``nebula_mq.launch.supervisor``).

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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nebula_mq.cli.options import STARTED_STACK_HELP, add_stack_option, default_stack, positive_seconds

if TYPE_CHECKING:
    from nebula_mq.launch import JobProcesses
    from nebula_mq.launch.supervisor import Periodic

DEFAULT_RESTARTS = 5


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run every role of a job against the local stack")
    p.add_argument("config", help="job TOML file")
    add_stack_option(p, STARTED_STACK_HELP, default_stack())
    p.add_argument("--timeout", type=positive_seconds, default=None, help="give up after this many seconds")
    p.add_argument("--metrics-port", type=int, default=0, metavar="BASE",
                   help="serve each worker's Prometheus metrics over HTTP: worker i (in `status` order) on BASE + i")
    p.add_argument("--max-restarts", "--restarts", dest="restarts", type=int, default=DEFAULT_RESTARTS, metavar="N",
                   help="restart a worker (and its gloo group) that dies on its own, at most N times in all "
                        f"(default {DEFAULT_RESTARTS}; 0: stop the job at the first failure)")
    p.set_defaults(func=_run)

    d = sub.add_parser("demo", help="build the data, then run the flagship ABNet job end to end")
    d.add_argument("job", nargs="?", metavar="JOB.toml", default=None,
                   help="the job file to run (default config/demo.toml)")
    d.add_argument("--config", metavar="JOB.toml", default=None, help="the older spelling of the positional")
    add_stack_option(d, STARTED_STACK_HELP, default_stack())
    d.add_argument("--keep-stack", action="store_true", help="leave the stack running afterwards")
    d.set_defaults(func=_demo)

    u = sub.add_parser("up", help="this host's part of a job: provision its cluster's broker, start and supervise "
                                  "its workers (run it again to resume)")
    u.add_argument("config", metavar="JOB.toml", help="the job file")
    u.add_argument("--cluster", required=True, metavar="NAME", help="the cluster this host belongs to")
    add_stack_option(u, "this host's stack directory, its broker up (default $NEBULA_RUN_DIR or run/stack)",
                     default_stack())
    u.add_argument("--ranks", type=ranks_list, default=None, metavar="I,J,...",
                   help="only these rank indices of the cluster's roles (the others run on other hosts); "
                        "default: every worker of the cluster")
    u.add_argument("--broker-host", default="", metavar="NAME",
                   help="this host runs ranks only: the cluster's broker runs on NAME (a name in its certificate), "
                        "whose `up` provisions the job; the stack directory and the job's run_dir are on a "
                        "filesystem this host shares with it")
    u.add_argument("--timeout", type=positive_seconds, default=None, help="give up after this many seconds")
    u.add_argument("--max-restarts", "--restarts", dest="restarts", type=int, default=DEFAULT_RESTARTS, metavar="N",
                   help=f"restart a worker that dies on its own at most N times in all (default {DEFAULT_RESTARTS})")
    u.set_defaults(func=_up)


def ranks_list(text: str) -> frozenset[int]:
    """argparse type of ``--ranks``: comma-separated rank indices >= 0, echoing a bad value."""
    try:
        ranks = frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rank indices like 0,1, got {text!r}") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"expected rank indices >= 0 like 0,1, got {text!r}")
    return ranks


def run_job(config: str, stack_dir: str, timeout: float | None = None, restarts: int = DEFAULT_RESTARTS,
            metrics_port: int = 0) -> int:
    from nebula_mq.launch import JobProcesses
    from nebula_mq.runtime.logs import configure_logging

    configure_logging("info")
    job = JobProcesses(config, stack_dir, metrics_port_base=metrics_port)
    job.claim_all()  # a rank running already, or placed on another host: refused before anything
    job.provision()
    started = time.time()
    start_workers(job)
    code = supervise_job(job, timeout, restarts)
    if code == 0:
        print_evaluation(job.settings, since=started)
    return code


def start_workers(job: JobProcesses) -> None:
    """Start this host's workers of ``job``; say where each one logs (and serves its metrics)."""
    from nebula_mq.runtime.logs import get_logger

    log = get_logger("nebula_mq.run")
    job.start_all()
    ports = job.metrics_ports()
    for worker, child in job.children.items():
        log.info("worker_started", worker=worker, pid=child.pid, log=str(job.log_of(worker)),
                 **({"metrics": f"http://localhost:{ports[worker]}/metrics"} if worker in ports else {}))


def print_evaluation(settings: Any, since: float) -> None:
    """The scores per domain and a few translations, when the job evaluated in this run."""
    import json

    from nebula_mq.report.evaluation import summary_text

    path = settings.run_dir / "eval.json"
    if not path.is_file() or path.stat().st_mtime < since:
        return
    body = json.loads(path.read_text(encoding="utf-8"))
    sources: dict[int, str] = {}
    data_dir = Path(settings.section("abnet").get("data_dir", "run/data"))
    split_file = data_dir / "parallel" / f"{body.get('split', 'test')}.jsonl"
    if settings.section("abnet").get("data") == "corpus" and split_file.is_file():  # this machine holds both sides
        wanted = set(body.get("sample_ids", []))
        with split_file.open(encoding="utf-8") as fh:
            sources = {i: json.loads(line)["src"] for i, line in enumerate(fh) if i in wanted}
    print(summary_text(body, sources))


def supervise_job(job: JobProcesses, timeout: float | None, restarts: int = DEFAULT_RESTARTS,
                  tasks: Sequence[Periodic] = ()) -> int:
    """Supervise the started job (``nebula_mq.launch.supervisor.supervise``, with ``tasks``),
    then print each worker's exit and how the run ended; returns the run's exit code."""
    from nebula_mq.launch.supervisor import supervise

    outcome = supervise(job, timeout, restarts, say=lambda line: print(line, file=sys.stderr), tasks=tasks)
    for worker, child in job.children.items():
        print(f"{worker}: exit {child.returncode}")
    from nebula_mq.report.derive import loss_summary

    summary = loss_summary(job.run_dir, list(job.children))
    if summary:
        print(summary)
    if outcome.failed:
        for line in outcome.why:
            print(f"failed: {line}", file=sys.stderr)
        if not outcome.why:
            print(f"failed: {', '.join(outcome.failed)}; logs in {job.logs}", file=sys.stderr)
    elif outcome.interrupted:
        print(f"stopped at step {job.slowest_step()} of {job.settings.job.steps}; "
              f"run the same command to resume", file=sys.stderr)
    return outcome.exit_code


def _run(args: argparse.Namespace) -> int:
    if args.metrics_port and not 0 < args.metrics_port < 65000:
        from nebula_mq.errors import ConfigError

        raise ConfigError("<command line>", "--metrics-port", "a base port in 1..64999", args.metrics_port)
    return run_job(args.config, args.stack, args.timeout, args.restarts, args.metrics_port)


def _demo(args: argparse.Namespace) -> int:
    from nebula_mq.report.render import build_report
    from nebula_mq.stack import Stack
    from workers.registry import load_job_settings

    config = args.job or args.config or "config/demo.toml"
    settings = load_job_settings(config)
    if settings.section("abnet").get("data", "synthetic") == "corpus":
        from nebula_mq.data.build import BuildOptions, build

        build(BuildOptions(out=Path(settings.section("abnet").get("data_dir", "run/data"))))
    code = run_job(config, args.stack)
    report = build_report(settings.run_dir)
    if not args.keep_stack:
        Stack.open(args.stack).down()
    if code == 0:
        print(f"demo finished: run dir {settings.run_dir}" + (f", report {report}" if report else ""))
    return code


def _up(args: argparse.Namespace) -> int:
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
                   scenario_of(job.settings).section, say=lambda line: print(line, file=sys.stderr, flush=True))
    start_workers(job)
    return supervise_job(job, args.timeout, args.restarts, () if refresh is None else (Periodic(CRL_REFRESH_S, refresh),))
