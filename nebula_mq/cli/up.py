"""``nebula-mq up JOB.toml --cluster NAME``: this host's part of a job, in one command.

A cluster is a broker host and the hosts of its ranks. On each host, after its stack is up
(``nebula-mq stack up --clusters NAME``, with ``--listen``/``--hostname`` for a broker the
other cluster reaches) and trusts the peer's CA (``certs import-ca``), ``up``:

1. provisions the job on this host's broker (vhost, users, exchanges, queues, the status
   feed, federation from the peers the job file names; idempotent: running ``up`` again
   changes nothing that is right already), and shares the job key over the brokers, sealed to
   each peer's CA (``cli.job_key``): the first cluster by name sends it, the others wait for it;
2. starts this host's workers of that cluster (all of them, or the ranks ``--ranks`` names:
   the others run on other hosts of the cluster) against the stack's broker;
3. supervises them with ``run``'s restart policy (a worker that dies is restarted with its
   group), forwards Ctrl-C and SIGTERM as SIGTERM (each worker checkpoints and exits 0),
   and exits when they have: running ``up`` again resumes from the checkpoints.

On a host of the cluster without its broker, ``up --ranks I --broker-host NAME`` does only 2
and 3: the broker host's ``up`` provisions the job and writes its key on the filesystem the
cluster's hosts share (stack directory and run_dir), and this host's workers reach the broker
by ``NAME``. On a stack that holds every cluster of the job (one machine), ``up --cluster``
runs that cluster's part, and ``run`` the whole job.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
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
    from nebula_mq.cli.provision import provision_cluster
    from nebula_mq.cli.run import start_workers, supervise_job
    from nebula_mq.launch.supervisor import Periodic
    from nebula_mq.errors import ConfigError
    from nebula_mq.launch import JobProcesses
    from nebula_mq.runtime.logs import configure_logging
    from nebula_mq.stack import Stack
    from nebula_mq.stack.layout import did_you_mean
    from workers.plans import plan_for
    from workers.registry import load_job_settings

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
    stack = Stack.open(args.stack)
    tasks: tuple[Periodic, ...] = ()
    if args.broker_host:  # the broker host's `up` provisions the job and holds its key
        from nebula_mq.cli.job_key import KEY_WAIT_S

        print(wait_for_job_key(job.settings, args.broker_host, KEY_WAIT_S), file=sys.stderr)
    elif set(clusters) <= set(stack.clusters):  # one machine holds the whole job: its relays link the clusters
        JobProcesses(args.config, args.stack).provision()
        print(f"job {job.settings.job.id}: provisioned on every cluster of the stack in {args.stack}", file=sys.stderr)
    else:
        from nebula_mq.cli.job_key import share_job_key

        refresh = trusted_peers(job.settings, job.plan, args.cluster, stack)
        _defs, summary = provision_cluster(job.settings, job.plan, args.cluster, stack, make_key=False)
        print(summary, file=sys.stderr)
        print(share_job_key(job.settings, job.plan, args.cluster, stack, say=_say), file=sys.stderr)
        tasks = (Periodic(CRL_REFRESH_S, refresh),)
    start_workers(job)
    return supervise_job(job, args.timeout, args.restarts, tasks)


# How often a broker host's `up` reads its peers' CRLs again from their brokers' handshakes.
CRL_REFRESH_S = 3600.0


def trusted_peers(settings: Any, plan: Any, cluster: str, stack: Any) -> Callable[[], None]:
    """Check that ``cluster`` trusts every peer cluster of the job (else one line saying which
    command makes it), refresh each one's CRL from its broker (``security.trust``), and return
    the refresh, for the supervisor to repeat while the job runs."""
    from nebula_mq.errors import CertificateError, NebulaError

    peers = sorted({c for f in plan.flows for c in (f.src_cluster, f.dst_cluster)} - {cluster})
    where = {p: settings.clusters[p].federation for p in peers if p in settings.clusters}
    for peer in peers:
        try:
            stack.ca(cluster).peer_ca(peer)
        except CertificateError:
            fed = where.get(peer)
            address = f"{fed.host}:{fed.port}" if fed is not None and fed.host else "HOST:PORT"
            raise CertificateError(f"{cluster} does not trust {peer} yet: run `nebula-mq stack trust {peer} {address} "
                                   f"--fingerprint ...` on this host, as {peer}'s `stack up` printed it") from None

    def refresh() -> None:
        for peer, fed in where.items():
            if not fed.host:
                continue
            try:
                stack.trust_peer(cluster, peer, fed.host, fed.port, None)
            except NebulaError as exc:  # the link's own state says the rest (`status`)
                _say(f"could not read {peer}'s CRL from {fed.host}:{fed.port} (the one held stays): {exc}")

    refresh()
    return refresh


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def wait_for_job_key(settings: Any, broker_host: str, wait_s: float) -> str:
    """The job key, written by the broker host's ``up`` on the shared filesystem, once it is
    there (it makes or receives the key before it starts a worker)."""
    import time

    from nebula_mq.cli.job_key import TELL_EVERY_S
    from nebula_mq.errors import SecurityError
    from nebula_mq.security.keys import KeyRing, job_key_file

    path = job_key_file(settings.run_dir)
    started = told = time.monotonic()
    while not path.exists():
        now = time.monotonic()
        if now - started > wait_s:
            raise SecurityError(f"no job key at {path} after {wait_s:g} s: start `nebula-mq up` on {broker_host} "
                                f"first (it provisions the job), with the same run_dir on a filesystem both hosts share")
        if now - told >= TELL_EVERY_S:
            told = now
            _say(f"waiting for the job key that `nebula-mq up` on {broker_host} writes to {path} "
                 f"({now - started:.0f} s of {wait_s:g}): is it running there, with this run_dir?")
        time.sleep(0.5)
    ring = KeyRing.load(path)
    if ring.job_id != settings.job.id:
        raise SecurityError(f"{path}: key ring of job {ring.job_id!r}, not {settings.job.id!r}")
    return f"job key {path} (from {broker_host}'s `up`)"
