"""``nebula-mq run JOB.toml`` and ``nebula-mq demo``: every role of a job on this machine.

``run`` brings the local stack up (idempotent), provisions the job on it
(vhost, certificate users, federation of the job's cross-cluster flows), and
starts one ``nebula-mq worker`` process per entry of the job's plan, each on
its own cluster's broker. It waits for them, showing each worker's step.
Ctrl-C or SIGTERM is forwarded as SIGTERM: workers checkpoint and exit, and a
later ``run`` of the same job resumes from the checkpoints. A worker that dies on
its own is restarted with its group (``--restarts``, ``nebula_mq.launch.supervisor``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nebula_mq.cli.options import add_stack_option, default_stack

if TYPE_CHECKING:
    from nebula_mq.launch import JobProcesses
    from nebula_mq.launch.supervisor import Periodic

DEFAULT_RESTARTS = 5


def positive_seconds(text: str) -> float:
    """argparse type of a time limit: a number > 0, echoing a bad value."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not seconds > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return seconds


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run every role of a job against the local stack")
    p.add_argument("config", help="job TOML file")
    add_stack_option(p, "local stack directory, started if needed (default $NEBULA_RUN_DIR or run/stack)",
                     default_stack())
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
    add_stack_option(d, "local stack directory, started if needed (default $NEBULA_RUN_DIR or run/stack)",
                     default_stack())
    d.add_argument("--keep-stack", action="store_true", help="leave the stack running afterwards")
    d.set_defaults(func=_demo)


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
    from workers.registry import load_job_settings
    from nebula_mq.stack import Stack

    config = args.job or args.config or "config/demo.toml"
    settings = load_job_settings(config)
    if settings.section("abnet").get("data", "synthetic") == "corpus":
        from nebula_mq.data.build import BuildOptions, build

        build(BuildOptions(out=Path(settings.section("abnet").get("data_dir", "run/data"))))
    code = run_job(config, args.stack)
    report = _report(settings.run_dir)
    if not args.keep_stack:
        Stack.open(args.stack).down()
    if code == 0:
        print(f"demo finished: run dir {settings.run_dir}" + (f", report {report}" if report else ""))
    return code


def _report(run_dir: Path) -> Path | None:
    from nebula_mq.report.render import build_report

    return build_report(run_dir)
