"""``nebula-mq run JOB.toml`` and ``nebula-mq demo``: every role of a job on this machine.

``run`` brings the local stack up (idempotent), provisions the job on it
(vhost, certificate users, federation of the job's cross-cluster flows), and
starts one ``nebula-mq worker`` process per entry of the job's plan, each on
its own cluster's broker. It waits for them, showing each worker's step.
Ctrl-C or SIGTERM is forwarded as SIGTERM: workers checkpoint and exit, and a
later ``run`` of the same job resumes from the checkpoints.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_STACK = "run/stack"


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run every role of a job against the local stack")
    p.add_argument("config", help="job TOML file")
    p.add_argument("--stack", default=os.environ.get("NEBULA_RUN_DIR", DEFAULT_STACK),
                   help="local stack run dir (started if needed)")
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    p.set_defaults(func=_run)

    d = sub.add_parser("demo", help="build the data, then run the flagship ABNet job end to end")
    d.add_argument("--config", default="config/demo.toml")
    d.add_argument("--stack", default=os.environ.get("NEBULA_RUN_DIR", DEFAULT_STACK))
    d.add_argument("--keep-stack", action="store_true", help="leave the stack running afterwards")
    d.set_defaults(func=_demo)


def run_job(config: str, stack_dir: str, timeout: float | None = None) -> int:
    from nebula_mq.cli._launcher import JobProcesses
    from nebula_mq.runtime.logs import configure_logging, get_logger

    configure_logging("info")
    log = get_logger("nebula_mq.run")
    job = JobProcesses(config, stack_dir)
    job.provision()
    job.start_all()
    for worker, child in job.children.items():
        log.info("worker_started", worker=worker, pid=child.pid, log=str(job.logs / f"{worker}.log"))
    return _supervise(job, timeout)


def _supervise(job: Any, timeout: float | None) -> int:
    from nebula_mq.runtime.progress import progress

    stopping = False

    def _forward(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        job.signal_all(signal.SIGTERM)

    previous = {s: signal.signal(s, _forward) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = None if timeout is None else time.monotonic() + timeout
    failed: list[str] = []
    try:
        with progress(job.settings.job.steps, "training (slowest worker)") as bar:
            done = 0
            while job.running():
                time.sleep(1.0)
                slowest = job.slowest_step()
                bar.update(max(0, slowest - done))
                done = max(done, slowest)
                failed = job.failed()
                if failed and not stopping:
                    _forward(signal.SIGTERM, None)
                if deadline is not None and time.monotonic() > deadline and not stopping:
                    print(f"timeout after {timeout:.0f} s: stopping workers", file=sys.stderr)
                    failed.append("timeout")
                    _forward(signal.SIGTERM, None)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    failed += job.failed()
    for worker, child in job.children.items():
        print(f"{worker}: exit {child.returncode}")
    if failed:
        print(f"failed: {sorted(set(failed))}; logs in {job.logs}", file=sys.stderr)
        return 1
    return 130 if stopping else 0


def _run(args: argparse.Namespace) -> int:
    return run_job(args.config, args.stack, args.timeout)


def _demo(args: argparse.Namespace) -> int:
    from nebula_mq.settings import load_settings
    from nebula_mq.stack import Stack

    settings = load_settings(args.config)
    if settings.abnet.get("data", "synthetic") == "corpus":
        from nebula_mq.data.build import BuildOptions, build

        build(BuildOptions(out=Path(settings.abnet.get("data_dir", "run/data"))))
    code = run_job(args.config, args.stack)
    report = _report(settings.run_dir)
    if not args.keep_stack:
        Stack.open(args.stack).down()
    if code == 0:
        print(f"demo finished: run dir {settings.run_dir}" + (f", report {report}" if report else ""))
    return code


def _report(run_dir: Path) -> Path | None:
    from nebula_mq.report.render import build_report

    return build_report(run_dir)
