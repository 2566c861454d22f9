"""Benchmarks behind ``nebula-mq bench <name>``; each module exposes ``run(args) -> int``."""

from __future__ import annotations

import os

from nebula_mq.stack.layout import port_free

# Where the benchmarks' gloo groups take their ports: below the ephemeral range (an outgoing
# connection could take a rank's port before it listens) and clear of the stacks the tools
# start (bases below 12000, dist ports 26000-32000; see ``stack.layout.free_base_port``).
GLOO_PORTS = range(20000, 25900)


def free_port_base(n: int) -> int:
    """A base port with ``base .. base + n`` free now: a gloo group's store and ``n`` ranks.
    Where it starts depends on the pid, so benchmarks started together pick different ones."""
    start = GLOO_PORTS.start + (os.getpid() * 11) % (len(GLOO_PORTS) // 2)
    for base in range(start, GLOO_PORTS.stop - n, 11):
        if all(port_free(port, reuse_addr=False) for port in range(base, base + n + 1)):
            return base
    raise RuntimeError(f"no {n + 1} free ports in {GLOO_PORTS.start}-{GLOO_PORTS.stop}")
