"""``nebula-mq provision|deprovision JOB.toml --cluster NAME``: set a job up on any broker, or remove it.

The broker is reached as an administrator through its management API (HTTPS with a client
certificate, and a user tagged ``administrator``). The job file says where the peers are
(``[clusters.<name>.federation]``: host, port, server_name, cert_dir), so the federation
upstreams point at real hostnames. ``nebula-mq run`` applies the same definitions to the
local stack through ``rabbitmqctl``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from nebula_mq.cli.options import add_stack_option


def register(subparsers: Any) -> None:
    for name, func, text in (
        ("provision", _provision, "create a job's vhost, users, exchanges, queues, policies and federation "
                                  "upstreams on one cluster's broker (re-running it is harmless)"),
        ("deprovision", _deprovision, "remove a job from one cluster's broker: its vhost and its own users, "
                                      "nothing else"),
    ):
        p = subparsers.add_parser(name, help=text, description=text)
        p.add_argument("config", metavar="JOB.toml", help="the job file (its [clusters.<name>] tables say where "
                                                          "each broker is)")
        p.add_argument("--cluster", metavar="NAME", help="the cluster whose broker to change (required unless --stack)")
        add_stack_option(p, "administer this host's stack through rabbitmqctl instead of the management API: "
                            "with --cluster, that cluster's node, peers as the job file names them; without, "
                            "every node of a local stack, peers through its WAN relays (what `nebula-mq run` does)")
        p.add_argument("--management-url", metavar="URL",
                       help="the broker's management API (default https://<[clusters.NAME.broker] server_name>:15671; "
                            "the TCP connection goes to its host)")
        p.add_argument("--admin-user", metavar="USER", default="admin",
                       help="a management user tagged administrator (default admin)")
        p.add_argument("--admin-password-file", metavar="FILE", help="a file holding that user's password")
        for opt, what in (("ca-file", "CA bundle that signed the broker's certificate"),
                          ("cert-file", "client certificate for the TLS handshake"),
                          ("key-file", "its private key")):
            p.add_argument(f"--{opt}", metavar="FILE", help=f"{what} (default: [clusters.NAME.broker] {opt.replace('-', '_')})")
        if name == "provision":
            p.add_argument("--monitoring-password-file", metavar="FILE",
                           help="password of the job's read-only monitoring user; made (mode 0600) when missing "
                                "(default <run_dir>/monitoring.password)")
            p.add_argument("--dry-run", action="store_true", help="print the definitions, change nothing")
        p.set_defaults(func=func)


def _job(args: argparse.Namespace) -> tuple[Any, Any]:
    from workers.registry import load_job_settings
    from workers.plans import plan_for

    settings = load_job_settings(args.config)
    return settings, plan_for(settings)


def _cluster(args: argparse.Namespace, settings: Any, plan: Any) -> str:
    from nebula_mq.errors import ConfigError
    from nebula_mq.stack.layout import did_you_mean

    known = sorted(plan.clusters)
    if not args.cluster or args.cluster not in known:
        raise ConfigError("<command line>", "--cluster", f"one of the job's clusters ({', '.join(known)})"
                          f"{did_you_mean(args.cluster or '', known)}", args.cluster)
    return str(args.cluster)


def _admin(args: argparse.Namespace, settings: Any, cluster: str) -> Any:
    """The management API of ``cluster``'s broker, as the administrator the options name."""
    import dataclasses
    from urllib.parse import urlsplit

    from nebula_mq.errors import ConfigError
    from nebula_mq.settings import BrokerSettings
    from nebula_mq.stack.admin import HttpAdmin

    if not args.admin_password_file:
        raise ConfigError("<command line>", "--admin-password-file", "a file holding the administrator's password")
    known = settings.clusters.get(cluster)
    broker = known.broker if known is not None else BrokerSettings()
    url = urlsplit(args.management_url or f"https://{broker.server_name}:15671")
    if url.scheme != "https" or not url.hostname:
        raise ConfigError("<command line>", "--management-url", "an https:// URL (the API is reached over TLS only)",
                          args.management_url)
    host = broker.host if not args.management_url else url.hostname
    broker = dataclasses.replace(
        broker, host=host, server_name=url.hostname, tls=True,
        ca_file=args.ca_file or broker.ca_file, cert_file=args.cert_file or broker.cert_file,
        key_file=args.key_file or broker.key_file, management_port=url.port or 15671,
        management_user=args.admin_user, management_password_file=args.admin_password_file)
    missing = [f for f in ("ca_file", "cert_file", "key_file") if not getattr(broker, f)]
    if missing:
        opt = "--" + missing[0].replace("_", "-")
        raise ConfigError("<command line>", opt, f"a file path (or [clusters.{cluster}.broker] {missing[0]})")
    return HttpAdmin(broker)


def _provision(args: argparse.Namespace) -> int:
    settings, plan = _job(args)
    if args.stack and not args.cluster and not args.dry_run:
        from nebula_mq.launch.processes import JobProcesses

        JobProcesses(args.config, args.stack).provision()
        print(f"job {settings.job.id}: provisioned on every cluster of the local stack in {args.stack}")
        return 0
    cluster = _cluster(args, settings, plan)
    stack = None
    if args.stack:
        from nebula_mq.stack import Stack

        stack = Stack.open(args.stack)
    from nebula_mq.stack.joining import provision_cluster

    defs, summary = provision_cluster(settings, plan, cluster, stack, args.monitoring_password_file, args.dry_run,
                                      admin=None if stack is not None or args.dry_run else _admin(args, settings, cluster))
    if args.dry_run:
        print(json.dumps(defs, indent=2))
        return 0
    print(summary)
    return 0


def _deprovision(args: argparse.Namespace) -> int:
    from nebula_mq.stack import Stack
    from nebula_mq.stack.admin import deprovision

    settings, plan = _job(args)
    workers = [p.identity(settings.job.id) for p in plan.processes]
    if args.stack:
        stack = Stack.open(args.stack)
        clusters = [_cluster(args, settings, plan)] if args.cluster else list(stack.clusters)
        targets = [(c, stack.admin(c)) for c in clusters]
    else:
        cluster = _cluster(args, settings, plan)
        targets = [(cluster, _admin(args, settings, cluster))]
    for cluster, admin in targets:
        removed = deprovision(admin, settings.job.id, workers)
        print(f"job {settings.job.id}: {cluster}: " + (f"removed {', '.join(removed)}" if removed else "nothing to remove"))
    return 0
