"""``nebula-mq worker --role ROLE --config FILE``: one long-running worker daemon.

With ``--stack RUN_DIR`` the broker settings of the worker's cluster come from
the local stack (its TLS identity is issued there); otherwise from the job
file's ``[clusters.<name>.broker]`` table, as in a real deployment.
SIGTERM finishes the micro-batch in flight, checkpoints, acks and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import signal
import socket
from typing import TYPE_CHECKING, Any

from nebula_mq.cli.options import LOG_LEVELS, add_stack_option
from nebula_mq.errors import ConfigError
from nebula_mq.settings import Settings

if TYPE_CHECKING:
    from workers.plans import Process


def port_number(text: str) -> int:
    """argparse type of a TCP port: 1..65535, echoing a bad value."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"expected a port in 1..65535, got {port}")
    return port


def register(sub: Any) -> None:
    p = sub.add_parser("worker", help="run one worker daemon of a job")
    p.add_argument("--role", required=True, help="e.g. abnet-encoder, abnet-decoder, electra-generator")
    p.add_argument("job", nargs="?", metavar="JOB.toml", help="the job file (as in every other verb)")
    p.add_argument("--config", metavar="JOB.toml", help="the job file, the older spelling of the positional")
    p.add_argument("--index", type=int, default=0, help="index among workers of the same role")
    add_stack_option(p, "take broker settings from this local stack directory (default: the job file's "
                        "[clusters.<name>.broker])")
    p.add_argument("--broker-host", default="", metavar="NAME",
                   help="with --stack: reach the stack's broker by this name from its certificate (a worker on "
                        "another machine or container that shares the stack directory; default: loopback)")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="debug, info (default), warning or error")
    p.add_argument("--metrics-port", type=port_number, default=None,
                   help="also serve Prometheus metrics over HTTP on this port (/metrics)")
    p.set_defaults(func=_run)


def job_file(args: argparse.Namespace) -> str:
    """The job file, given as the positional argument or with ``--config`` (once, not both)."""
    if bool(args.job) == bool(args.config):
        raise ConfigError("<command line>", "JOB.toml", "the job file, once: `worker JOB.toml --role ...` "
                          "(or the older --config JOB.toml)", args.job or args.config)
    return str(args.job or args.config)


def find_process(settings: Settings, role: str, index: int) -> Process:
    """This job's process ``role`` #``index``; a role the job does not run is the command line's fault."""
    from workers.plans import plan_for

    processes = plan_for(settings).processes
    for proc in processes:
        if proc.role == role and proc.index == index:
            return proc
    known = ", ".join(f"--role {p.role} --index {p.index}" for p in processes)
    raise ConfigError("<command line>", "--role/--index", f"a process of job {settings.job.id!r} ({known})",
                      f"--role {role} --index {index}")


def check_metrics_port(port: int) -> None:
    """Fail before any model is built when the metrics port is taken.

    Binds as the metrics server will (all interfaces, address reuse); the
    server itself still reports a port taken in between (``MetricsHook``).
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as exc:
            busy = "already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise ConfigError("<command line>", "--metrics-port", f"a free port ({port} is {busy})",
                              port) from None


def _run(args: argparse.Namespace) -> int:
    from nebula_mq.runtime.logs import configure_logging
    from nebula_mq.runtime.signals import hold_stop_signals

    hold_stop_signals()  # until the role's driver handles them: a stop during start-up is a clean stop
    from nebula_mq.errors import PlacementError, one_line
    from nebula_mq.runtime.reporter import record_stop
    from workers.claim import claim_rank
    from nebula_mq.stack import Stack
    from workers.plans import run_role, with_stack_broker
    from workers.registry import load_job_settings

    configure_logging(args.log_level)
    settings = load_job_settings(job_file(args))
    proc = find_process(settings, args.role, args.index)
    # Held until the process exits: a second copy of this rank is refused, as is this one on a
    # host the job file does not place it on, before either touches the job.
    claim = claim_rank(settings, proc, "nebula-mq worker")
    if args.metrics_port:
        check_metrics_port(args.metrics_port)
    if args.stack:
        settings = with_stack_broker(settings, Stack.open(args.stack), proc, args.broker_host)
    elif args.broker_host:
        raise ConfigError("<command line>", "--broker-host", "--stack DIR as well (otherwise the job file's "
                          f"[clusters.{proc.cluster}.broker] host applies)", args.broker_host)
    elif proc.cluster not in settings.clusters or not settings.clusters[proc.cluster].names_broker:
        raise ConfigError(
            settings.source, f"clusters.{proc.cluster}.broker",
            f"broker settings for cluster {proc.cluster!r}, where {proc.role} #{proc.index} runs "
            f"(the job has none: pass --stack DIR to take them from a local stack, or add a "
            f"[clusters.{proc.cluster}.broker] table with host, port, vhost, ca_file, cert_file, key_file)")
    if args.metrics_port:
        settings = dataclasses.replace(settings, job=dataclasses.replace(settings.job, metrics_port=args.metrics_port))
    try:
        return run_role(args.role, settings, args.index)
    except Exception as exc:
        # A worker that stopped while it started (its model, device or data refused) has
        # no reporter yet: its status still says why. A refused placement touches nothing.
        if not isinstance(exc, PlacementError):
            record_stop(settings, proc.worker_id, one_line(exc), role=proc.role, cluster=proc.cluster)
        raise
    finally:
        claim.release()
        # The role has checkpointed and returned. Python resets its signal handlers to
        # the defaults while it shuts down (paddle's teardown takes a while), so the
        # SIGTERM `nebula-mq run` forwards after a Ctrl-C would kill a worker that has
        # already stopped cleanly (exit -15). A stopped worker ignores further SIGTERMs.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
