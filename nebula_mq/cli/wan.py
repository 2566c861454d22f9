"""``nebula-mq wan shape|cut|drop|heal|status``: act on the running stack's emulated WAN links.

A link is named after the cluster it leads to; ``--to CLUSTER`` (or ``cut``/``drop``/``heal``'s
``CLUSTER``) picks one, default all. ``cut`` resets every connection (the peers see the link
fail at once and reconnect); ``drop`` loses everything without resetting anything, as most
real WAN outages do (connections survive a drop shorter than their heartbeat timeout).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from nebula_mq.cli.options import add_stack_option


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("wan", help="shape, cut, drop or heal the emulated WAN between clusters")
    sub = parser.add_subparsers(dest="wan_cmd", metavar="CMD", required=True)
    shape = sub.add_parser("shape", help="set bandwidth cap and/or one-way delay")
    shape.add_argument("--rate-mbit", "--rate", dest="rate", type=float, metavar="MBIT",
                       help="Mbit/s per direction (0 = unlimited)")
    shape.add_argument("--delay-ms", "--delay", dest="delay", type=float, metavar="MS", help="one-way delay in ms")
    shape.set_defaults(func=_shape)
    for name, func, text in (("cut", _cut, "reset every connection and refuse new ones"),
                             ("drop", _drop, "blackhole the link: connections stay open, no byte crosses, "
                                             "new ones go unanswered"),
                             ("heal", _heal, "end a cut or a drop: traffic flows again"),
                             ("status", _status, "print each link's shape and counters")):
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
    return _status(args)


def _cut(args: argparse.Namespace) -> int:
    _stack(args).cut(_target(args))
    return _status(args)


def _drop(args: argparse.Namespace) -> int:
    _stack(args).drop(_target(args))
    return _status(args)


def _heal(args: argparse.Namespace) -> int:
    _stack(args).heal(_target(args))
    return _status(args)


def _status(args: argparse.Namespace) -> int:
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
