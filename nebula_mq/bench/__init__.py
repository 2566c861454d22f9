"""Benchmarks behind ``nebula-mq bench <name>``; each module exposes ``run(args) -> int``."""

from __future__ import annotations

import socket


def free_port_base(n: int, start: int) -> int:
    """A base port from ``start`` on with ``base .. base + n`` free now (a gloo group's
    store and ranks, or a stack's ports)."""
    for base in range(start, start + 4000, 11):
        try:
            for port in range(base, base + n + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {n + 1} free ports from {start}")
