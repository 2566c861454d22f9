"""``nebula-mq stack up|status|down``: the local TLS-only nodes, one per cluster, and their relays."""

from __future__ import annotations

import argparse
import time
from typing import Any

from nebula_mq.cli.options import add_stack_option


def _add_common(p: argparse.ArgumentParser) -> None:
    add_stack_option(p)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("stack", help="start, inspect or stop the local broker stack")
    sub = parser.add_subparsers(dest="stack_cmd", metavar="CMD", required=True)
    up = sub.add_parser("up", help="start every node and relay, wait until ready; running nodes reload their "
                                   "certificates (after `certs import-ca`)")
    _add_common(up)
    up.add_argument("--clusters", default=None,
                    help="comma-separated cluster names (default: the saved stack's, else cluster-a,cluster-b)")
    up.add_argument("--base-port", type=int, default=None,
                    help="TLS port of the first node (default: the saved stack's, else 5681; relays +10, dist +20000)")
    up.add_argument("--prefix", default=None, help="Erlang node name prefix (default: the saved stack's, else nebula)")
    up.add_argument("--listen", default=None, metavar="ADDR",
                    help="also accept AMQPS on this address of this host, for peers and workers on other hosts "
                         "(default: the saved stack's, else loopback only)")
    up.add_argument("--hostname", action="append", default=None, metavar="H",
                    help="a name other hosts reach the node by, put in its certificate (repeatable; default: "
                         "the saved stack's)")
    up.add_argument("--management-listen", default=None, metavar="ADDR",
                    help="the management API's address (default: the saved stack's, else loopback; a compose "
                         "project's workers reach it on the project's own network)")
    up.add_argument("--foreground", action="store_true",
                    help="run the one cluster's node in the foreground, without a WAN relay (a container's main "
                         "process: docker-compose.yml)")
    up.set_defaults(func=_up)
    for name, func, text in (("status", _status, "print each node's state"),
                             ("down", _down, "stop every node and relay")):
        p = sub.add_parser(name, help=text)
        _add_common(p)
        p.set_defaults(func=func)
    restart = sub.add_parser("restart", help="stop and start one cluster's broker node (workers reconnect and "
                                             "federation links come back; queued messages survive)")
    restart.add_argument("cluster", metavar="CLUSTER", help="the cluster whose node to restart (see `stack status`)")
    _add_common(restart)
    restart.set_defaults(func=_restart)


def _up(args: argparse.Namespace) -> int:
    from nebula_mq.stack import Stack

    clusters = None if args.clusters is None else tuple(c.strip() for c in args.clusters.split(",") if c.strip())
    stack = Stack(args.stack, clusters, args.base_port, args.prefix, args.listen, args.hostname,
                  args.management_listen)
    if args.foreground:
        stack.serve()
    t0 = time.monotonic()
    stack.up()
    print(f"stack up in {time.monotonic() - t0:.1f} s ({stack.layout.run_dir})")
    return _print(stack)


def _status(args: argparse.Namespace) -> int:
    from nebula_mq.stack import Stack

    stack = Stack.open(args.stack)
    _print(stack)
    return 0 if all(s.running for s in stack.status().values()) else 3


def _restart(args: argparse.Namespace) -> int:
    from nebula_mq.stack import Stack

    stack = Stack.open(args.stack)
    t0 = time.monotonic()
    stack.restart_node(args.cluster)  # an unknown cluster is a StackError naming the known ones
    print(f"{args.cluster}: restarted in {time.monotonic() - t0:.1f} s")
    return _print(stack)


def _down(args: argparse.Namespace) -> int:
    from nebula_mq.stack import Stack

    Stack.open(args.stack).down()
    print("stack down")
    return 0


def _print(stack: Any) -> int:
    for s in stack.status().values():
        state = "running" if s.running else "stopped"
        relay = f"relay pid {s.relay_pid}" if s.relay_pid else "relay stopped"
        link = "CUT" if s.shape.cut else f"{s.shape.rate_mbit:g} Mbit/s, +{s.shape.delay_ms:g} ms"
        mgmt = f"  management https://localhost:{s.mgmt_port}/" if s.mgmt_port else ""
        print(f"{s.cluster:12} {s.node:32} {state:8} amqps://localhost:{s.tls_port}  "
              f"wan :{s.relay_port} ({relay}; {link}){mgmt}")
    for line in link_lines(stack):
        print(line)
    return 0


def link_lines(stack: Any, vhost: str = "") -> list[str]:
    """One line per federation link of the stack's running nodes (``vhost``'s only when given):
    up, or down for how long and in RabbitMQ's words; a node that cannot say, why."""
    from nebula_mq.errors import NebulaError

    lines = []
    for cluster, s in stack.status().items():
        if not s.running:
            continue
        try:
            links = stack.federation_links(cluster, vhost)
        except NebulaError as exc:
            lines.append(f"links of {cluster}: cannot read them ({exc})")
            continue
        lines += [f"{link.line()}" + ("" if vhost else f" [{link.vhost}]") for link in links]
    return lines
