"""``nebula-mq stack up|status|down``: the local TLS-only nodes, one per cluster, and their relays.

``nebula-mq wan shape|cut|drop|heal|status``: act on the running stack's emulated WAN links.
A link is named after the cluster it leads to; ``--to CLUSTER`` (or ``cut``/``drop``/``heal``'s
``CLUSTER``) picks one, default all. ``cut`` resets every connection (the peers see the link
fail at once and reconnect); ``drop`` loses everything without resetting anything, as most
real WAN outages do (connections survive a drop shorter than their heartbeat timeout).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from nebula_mq.cli.options import add_stack_option


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("stack", help="start, inspect or stop the local broker stack")
    sub = parser.add_subparsers(dest="stack_cmd", metavar="CMD", required=True)
    up = sub.add_parser("up", help="start every node and relay, wait until ready; running nodes reload their "
                                   "certificates (after `certs import-ca`)")
    add_stack_option(up)
    up.add_argument("--clusters", default=None,
                    help="comma-separated cluster names (default: the saved stack's, else cluster-a,cluster-b)")
    up.add_argument("--base-port", type=int, default=None,
                    help="TLS port of the first node (default: the saved stack's, else 5681; relays +10, dist +20000)")
    up.add_argument("--prefix", default=None, help="Erlang node name prefix (default: the saved stack's, else nebula)")
    up.add_argument("--listen", default=None, metavar="ADDR",
                    help="also accept AMQPS on this address of this host, for peers and workers on other hosts "
                         "(default: the address --hostname resolves to, if it is this host's; else the saved "
                         "stack's, else loopback only)")
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
        add_stack_option(p)
        p.set_defaults(func=func)
    trust = sub.add_parser("trust", help="trust a peer cluster, read from its broker and checked against the "
                                         "fingerprint its `stack up` printed (its CA and CRL; no file to carry)")
    trust.add_argument("peer", metavar="PEER", help="the peer cluster's name, e.g. cluster-b")
    trust.add_argument("address", metavar="HOST:PORT", type=host_port,
                       help="where the peer's broker answers (the name in its certificate, its AMQPS port)")
    trust.add_argument("--fingerprint", required=True, metavar="sha256:HEX",
                       help="the peer CA's fingerprint, as the peer's `stack up` printed it")
    trust.add_argument("--cluster", default=None, metavar="NAME",
                       help="the cluster of this stack that trusts the peer (default: the stack's only one)")
    add_stack_option(trust)
    trust.set_defaults(func=_trust)
    restart = sub.add_parser("restart", help="stop and start one cluster's broker node (workers reconnect and "
                                             "federation links come back; queued messages survive)")
    restart.add_argument("cluster", metavar="CLUSTER", help="the cluster whose node to restart (see `stack status`)")
    add_stack_option(restart)
    restart.set_defaults(func=_restart)

    parser = subparsers.add_parser("wan", help="shape, cut, drop or heal the emulated WAN between clusters")
    sub = parser.add_subparsers(dest="wan_cmd", metavar="CMD", required=True)
    shape = sub.add_parser("shape", help="set bandwidth cap and/or one-way delay")
    shape.add_argument("--rate-mbit", "--rate", dest="rate", type=float, metavar="MBIT",
                       help="Mbit/s per direction (0 = unlimited)")
    shape.add_argument("--delay-ms", "--delay", dest="delay", type=float, metavar="MS", help="one-way delay in ms")
    shape.set_defaults(func=_shape)
    for name, func, text in (("cut", _cut_drop_heal, "reset every connection and refuse new ones"),
                             ("drop", _cut_drop_heal, "blackhole the link: connections stay open, no byte crosses, "
                                                      "new ones go unanswered"),
                             ("heal", _cut_drop_heal, "end a cut or a drop: traffic flows again"),
                             ("status", _wan_status, "print each link's shape and counters")):
        p = sub.add_parser(name, help=text)
        p.set_defaults(func=func)
        if name == "status":
            p.add_argument("--json", action="store_true", help="print the relays' raw state as JSON")
        else:
            p.add_argument("cluster", nargs="?", metavar="CLUSTER", help="only the link leading to this cluster")
    for p in sub.choices.values():
        add_stack_option(p)
        p.add_argument("--to", metavar="CLUSTER", help="only the link leading to this cluster")


def _stack(args: argparse.Namespace) -> Any:
    from nebula_mq.stack import Stack

    return Stack.open(args.stack)


def _up(args: argparse.Namespace) -> int:
    from nebula_mq.stack import Stack

    clusters = None if args.clusters is None else tuple(c.strip() for c in args.clusters.split(",") if c.strip())
    listen = args.listen or listen_for(args.hostname)
    stack = Stack(args.stack, clusters, args.base_port, args.prefix, listen, args.hostname,
                  args.management_listen)
    refuse_changed_layout(stack, args, clusters, listen)
    if args.foreground:
        stack.serve()
    t0 = time.monotonic()
    stack.up()
    print(f"stack up in {time.monotonic() - t0:.1f} s ({stack.layout.run_dir})")
    code = _print(stack)
    lines = trust_lines(stack)
    if lines:
        print("for a peer cluster to trust this one, run this on its broker host:")
        for line in lines:
            print(f"  {line}")
    return code


def listen_for(hostnames: list[str] | None) -> str | None:
    """The address to listen on for a node other hosts reach by the first of ``hostnames``: the
    one that name resolves to, when it is an address of this host (None: no name given, or it
    resolves elsewhere, said on stderr; the saved stack's or loopback then)."""
    import ipaddress

    from nebula_mq.errors import NebulaError
    from nebula_mq.models.group_address import interface_with, resolve

    if not hostnames:
        return None
    try:
        address = resolve(hostnames[0])
    except NebulaError as exc:
        print(f"nebula-mq: {exc}: peers cannot reach this node by that name yet", file=sys.stderr)
        return None
    if ipaddress.ip_address(address).is_loopback:
        return None
    if interface_with(address) is None:
        print(f"nebula-mq: {hostnames[0]} resolves to {address}, which is not an address of this host: peers "
              f"cannot reach this node until --listen names one", file=sys.stderr)
        return None
    return address


def refuse_changed_layout(stack: Any, args: argparse.Namespace, clusters: tuple[str, ...] | None,
                          listen: str | None) -> None:
    """A running stack keeps its layout: asked for another, say what runs and how to change it
    (nothing is started or changed) rather than keep it in silence."""
    from nebula_mq.errors import StackError

    layout = stack.layout
    asked = {"--clusters": (clusters, layout.clusters), "--base-port": (args.base_port, layout.base_port),
             "--prefix": (args.prefix, layout.prefix), "--listen": (listen, layout.listen),
             "--hostname": (tuple(args.hostname) if args.hostname else None, layout.hostnames),
             "--management-listen": (args.management_listen, layout.management_listen)}
    changed = [f"{flag} {_shown(running)} (not {_shown(wanted)})" for flag, (wanted, running) in asked.items()
               if wanted is not None and wanted != running]
    if changed:
        raise StackError(f"the stack in {layout.run_dir} is running with {', '.join(changed)} and keeps its layout "
                         f"while it runs: `nebula-mq stack down --stack {layout.run_dir}` first, then `stack up` again")


def _shown(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


def trust_lines(stack: Any) -> list[str]:
    """For each node other hosts reach (``--listen``/``--hostname``), the command a peer's broker
    host runs to trust its cluster (``security.trust``)."""
    from nebula_mq.security.trust import trust_line

    layout = stack.layout
    reached = layout.hostnames[0] if layout.hostnames else layout.listen
    if reached in ("127.0.0.1", "0.0.0.0", "::"):
        return []
    return [trust_line(stack.ca(n.cluster), reached, n.tls_port) for n in layout.nodes]


def host_port(text: str) -> tuple[str, int]:
    """argparse type of ``HOST:PORT``, echoing a bad value."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT like b1.example.org:5671, got {text!r}")
    return host.strip("[]"), int(port)


def _trust(args: argparse.Namespace) -> int:
    from nebula_mq.errors import StackError
    from nebula_mq.security.trust import fingerprint
    from nebula_mq.stack.layout import did_you_mean

    stack = _stack(args)
    own = args.cluster or (stack.clusters[0] if len(stack.clusters) == 1 else None)
    if own is None or own not in stack.clusters:
        raise StackError(f"--cluster: one of this stack's clusters ({', '.join(stack.clusters)})"
                         f"{did_you_mean(args.cluster or '', stack.clusters) if args.cluster else ''}")
    if args.peer in stack.clusters:
        raise StackError(f"{args.peer} is a cluster of this stack already: it trusts its own CA")
    host, port = args.address
    chain = stack.trust_peer(own, args.peer, host, port, args.fingerprint)
    print(f"{own} trusts {args.peer} now: CA {fingerprint(chain.ca)}, CRL of "
          f"{chain.crl.last_update_utc:%Y-%m-%d %H:%M} UTC ({len(list(chain.crl))} revoked); "
          f"its links from {args.peer} come up within seconds")
    return 0


def _status(args: argparse.Namespace) -> int:
    stack = _stack(args)
    _print(stack)
    return 0 if all(s.running for s in stack.status().values()) else 3


def _restart(args: argparse.Namespace) -> int:
    stack = _stack(args)
    t0 = time.monotonic()
    stack.restart_node(args.cluster)  # an unknown cluster is a StackError naming the known ones
    print(f"{args.cluster}: restarted in {time.monotonic() - t0:.1f} s")
    return _print(stack)


def _down(args: argparse.Namespace) -> int:
    _stack(args).down()
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


def _target(args: argparse.Namespace) -> str | None:
    """The one link to act on (``CLUSTER`` or ``--to``), or None for all."""
    from nebula_mq.errors import StackError

    cluster = getattr(args, "cluster", None)
    if cluster and args.to and cluster != args.to:
        raise StackError(f"wan {args.wan_cmd}: CLUSTER {cluster!r} and --to {args.to!r} disagree; give one")
    args.to = cluster or args.to
    return args.to


def _shape(args: argparse.Namespace) -> int:
    changes = {k: v for k, v in (("rate_mbit", args.rate), ("delay_ms", args.delay)) if v is not None}
    _stack(args).shape(args.to, **changes)
    return _wan_status(args)


def _cut_drop_heal(args: argparse.Namespace) -> int:
    """``wan cut|drop|heal``: the stack's method of that name, on the one link named or on all."""
    getattr(_stack(args), args.wan_cmd)(_target(args))
    return _wan_status(args)


def _wan_status(args: argparse.Namespace) -> int:
    links = {name: st for name, st in _stack(args).wan_status().items() if not args.to or name == f"to-{args.to}"}
    if getattr(args, "json", False):
        print(json.dumps(links, sort_keys=True, indent=1))
        return 0
    for line in status_lines(links):
        print(line)
    return 0


def status_lines(links: dict[str, Any]) -> list[str]:
    """One readable line per relay: its shape, connections (relayed; waiting at a drop now, and held by drops
    since it started) and bytes each way."""
    from nebula_mq.report.derive import human_bytes

    lines = [f"{'link':<16}{'state':<8}{'rate':>12}{'delay':>10}{'conns':>7}{'waiting':>9}{'held':>6}"
             f"{'up':>11}{'down':>11}  as of"]
    for name, st in links.items():
        if not st:
            lines.append(f"{name:<16}{'down':<8}  relay not running")
            continue
        shape, counters = st.get("shape", {}), st.get("counters", {})
        rate = float(shape.get("rate_mbit") or 0)
        state = "CUT" if shape.get("cut") else "DROP" if shape.get("drop") else "up"
        lines.append(f"{name:<16}{state:<8}"
                     f"{(f'{rate:g} Mbit/s' if rate else 'unlimited'):>12}{float(shape.get('delay_ms') or 0):>7g} ms"
                     f"{int(st.get('connections', 0)):>7}{int(st.get('waiting', 0)):>9}"
                     f"{int(counters.get('held', 0)):>6}{human_bytes(counters.get('up', 0)):>11}"
                     f"{human_bytes(counters.get('down', 0)):>11}  {time.strftime('%H:%M:%S', time.localtime(st.get('time', 0)))}")
    return lines
