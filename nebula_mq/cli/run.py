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
import signal
import sys
import time
from pathlib import Path
from typing import Any

from nebula_mq.cli.options import add_stack_option, default_stack

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
    d.add_argument("--config", default="config/demo.toml", help="the job file to run (default config/demo.toml)")
    add_stack_option(d, "local stack directory, started if needed (default $NEBULA_RUN_DIR or run/stack)",
                     default_stack())
    d.add_argument("--keep-stack", action="store_true", help="leave the stack running afterwards")
    d.set_defaults(func=_demo)


def run_job(config: str, stack_dir: str, timeout: float | None = None, restarts: int = DEFAULT_RESTARTS,
            metrics_port: int = 0) -> int:
    from nebula_mq.launch import JobProcesses
    from nebula_mq.runtime.logs import configure_logging, get_logger

    configure_logging("info")
    log = get_logger("nebula_mq.run")
    job = JobProcesses(config, stack_dir, metrics_port_base=metrics_port)
    job.provision()
    started = time.time()
    job.start_all()
    ports = job.metrics_ports()
    for worker, child in job.children.items():
        log.info("worker_started", worker=worker, pid=child.pid, log=str(job.logs / f"{worker}.log"),
                 **({"metrics": f"http://localhost:{ports[worker]}/metrics"} if worker in ports else {}))
    code = _supervise(job, timeout, restarts)
    if code == 0:
        print_evaluation(job.settings, since=started)
    return code


def print_evaluation(settings: Any, since: float) -> None:
    """The scores per domain and a few translations, when the job evaluated in this run."""
    import json

    from nebula_mq.report.evaluation import summary_text

    path = settings.run_dir / "eval.json"
    if not path.is_file() or path.stat().st_mtime < since:
        return
    body = json.loads(path.read_text(encoding="utf-8"))
    sources: dict[int, str] = {}
    data_dir = Path(settings.abnet.get("data_dir", "run/data"))
    split_file = data_dir / "parallel" / f"{body.get('split', 'test')}.jsonl"
    if settings.abnet.get("data") == "corpus" and split_file.is_file():  # this machine holds both sides
        wanted = set(body.get("sample_ids", []))
        with split_file.open(encoding="utf-8") as fh:
            sources = {i: json.loads(line)["src"] for i, line in enumerate(fh) if i in wanted}
    print(summary_text(body, sources))


# Exit codes of a worker stopped by a signal someone sent (not restarted).
ASKED_TO_STOP = (130, 143, -signal.SIGINT, -signal.SIGTERM)
# How long workers get to finish their micro-batch and checkpoint after a stop request.
STOP_GRACE_S = 120.0


def _supervise(job: Any, timeout: float | None, restarts: int = DEFAULT_RESTARTS) -> int:
    from nebula_mq.launch.supervisor import RestartPolicy
    from nebula_mq.runtime.progress import progress
    from nebula_mq.runtime.signals import StopFlag

    # The handler only records the signal (see nebula_mq.runtime.signals); this loop
    # forwards it. A second Ctrl-C kills the workers: each one's last checkpoint
    # stands and the broker redelivers what came after it when the job is run again.
    received = StopFlag()

    def _on_signal(signum: int, _frame: Any) -> None:
        received.signals.append(signum)
        received.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    deadline = None if timeout is None else time.monotonic() + timeout
    reasons: list[str] = []  # why the job was stopped, besides failed workers
    stopping = killed = False
    stop_since = 0.0
    policy = RestartPolicy(max(0, restarts), say=lambda line: print(line, file=sys.stderr),
                           faults_log=job.run_dir / "faults.jsonl")
    try:
        with progress(job.settings.job.steps, "training (slowest worker)") as bar:
            done = 0
            while job.running():
                if received.is_set() and not stopping:
                    stopping = True
                    print("stopping: workers finish their micro-batch and checkpoint "
                          "(Ctrl-C again to kill them now)", file=sys.stderr)
                    job.signal_all(signal.SIGTERM)
                stop_since = stop_since or (time.monotonic() if stopping else 0.0)
                if received.signals.count(signal.SIGINT) >= 2 and not killed:
                    killed = True
                    print("second interrupt: killing the workers", file=sys.stderr)
                    job.signal_all(signal.SIGKILL)
                elif stop_since and time.monotonic() - stop_since > STOP_GRACE_S and not killed:
                    # A rank blocked in a collective whose peer died never sees SIGTERM.
                    killed = True
                    print(f"workers still running {STOP_GRACE_S:.0f} s after the stop request: "
                          f"killing them ({', '.join(w for w, c in job.children.items() if c.poll() is None)})",
                          file=sys.stderr)
                    reasons.append("stop grace exceeded")
                    job.signal_all(signal.SIGKILL)
                time.sleep(0.2)
                statuses = job.statuses()  # one read of the status files per tick
                policy.poll(job.steps(statuses))
                slowest = job.slowest_step(statuses)
                loss = job.loss(statuses)
                if loss is not None:
                    bar.set_postfix(loss=loss)
                bar.set_phase(job.phase(statuses))
                bar.update(max(0, slowest - done))
                done = max(done, slowest)
                # Not while stopping, nor for a worker a signal stopped: a terminal's Ctrl-C reaches
                # the workers too, sometimes before this loop has seen it.
                for worker in job.failed() if not (stopping or received.is_set()) else ():
                    code = job.children[worker].poll()
                    if code is None:
                        continue  # restarted already, with another member of its group
                    if code in ASKED_TO_STOP or not policy.restart(job, worker, code):
                        stopping = True
                        job.signal_all(signal.SIGTERM)
                        break
                if deadline is not None and time.monotonic() > deadline and not stopping:
                    print(f"timeout after {timeout:.0f} s: stopping workers", file=sys.stderr)
                    reasons.append("timeout")
                    stopping = True
                    job.signal_all(signal.SIGTERM)
    finally:
        policy.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    interrupted = received.is_set()
    # Workers a second Ctrl-C stopped at once (130, or killed by it) did what was asked.
    forced = (130, -signal.SIGINT, -signal.SIGKILL)
    failed = reasons + [w for w in job.failed() if not (interrupted and job.children[w].returncode in forced)]
    for worker, child in job.children.items():
        print(f"{worker}: exit {child.returncode}")
    if failed:
        print(f"failed: {sorted(set(failed))}; logs in {job.logs}", file=sys.stderr)
        return 1
    if interrupted:
        print(f"stopped at step {job.slowest_step()} of {job.settings.job.steps}; "
              f"run the same command to resume", file=sys.stderr)
    return interrupted_exit_code(received.signals) if interrupted else 0


def interrupted_exit_code(signals: list[int]) -> int:
    """The shell's convention for a run ended by a signal: 128 + the first one received
    (130 after Ctrl-C, 143 after SIGTERM)."""
    return 128 + int(signals[0] if signals else signal.SIGINT)


def _run(args: argparse.Namespace) -> int:
    if args.metrics_port and not 0 < args.metrics_port < 65000:
        from nebula_mq.errors import ConfigError

        raise ConfigError("<command line>", "--metrics-port", "a base port in 1..64999", args.metrics_port)
    return run_job(args.config, args.stack, args.timeout, args.restarts, args.metrics_port)


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
