"""``nebula-mq wan shape|cut|heal|status``: act on the running stack's emulated WAN links.

A link is named after the cluster it leads to; ``--to CLUSTER`` picks one, default all.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("wan", help="shape, cut or heal the emulated WAN between clusters")
    sub = parser.add_subparsers(dest="wan_cmd", metavar="CMD", required=True)
    shape = sub.add_parser("shape", help="set bandwidth cap and/or one-way delay")
    shape.add_argument("--rate", type=float, help="Mbit/s per direction (0 = unlimited)")
    shape.add_argument("--delay", type=float, help="one-way delay in ms")
    shape.set_defaults(func=_shape)
    for name, func, text in (("cut", _cut, "drop every connection and refuse new ones"),
                             ("heal", _heal, "accept connections again"),
                             ("status", _status, "print each link's shape and counters")):
        p = sub.add_parser(name, help=text)
        p.set_defaults(func=func)
    for p in sub.choices.values():
        p.add_argument("--run-dir", help="stack directory (default $NEBULA_RUN_DIR or run/stack)")
        p.add_argument("--to", metavar="CLUSTER", help="only the link leading to this cluster")


def _stack(args: argparse.Namespace) -> Any:
    from nebula_mq.stack import Stack

    return Stack.open(args.run_dir)


def _shape(args: argparse.Namespace) -> int:
    changes = {k: v for k, v in (("rate_mbit", args.rate), ("delay_ms", args.delay)) if v is not None}
    _stack(args).shape(args.to, **changes)
    return _status(args)


def _cut(args: argparse.Namespace) -> int:
    _stack(args).cut(args.to)
    return _status(args)


def _heal(args: argparse.Namespace) -> int:
    _stack(args).heal(args.to)
    return _status(args)


def _status(args: argparse.Namespace) -> int:
    for name, st in _stack(args).wan_status().items():
        if args.to and name != f"to-{args.to}":
            continue
        print(f"{name}: {json.dumps(st, sort_keys=True)}" if st else f"{name}: relay not running")
    return 0
