"""Recovery after an outage in the kernel: the link between two network namespaces set down.

The stack's relay emulates a non-resetting drop by holding every byte and releasing it at the
heal: TCP's best case. Here the brokers sit in two namespaces joined by a veth pair
(:mod:`nebula_mq.bench.wan_netns`) and ``drop`` sets that link down on both ends: packets are
lost, not held, nothing is reset, and each connection comes back on TCP's own retransmission
timer. ``reset`` runs beside it on the same hosts: the relay in front of each broker resets
every connection across it and refuses new ones, as the stack's cut does.

The delay is the relays' (this kernel has no ``netem``): it is added above TCP, so the
connections across the veth see a round trip of well under a millisecond, and their
retransmission timeouts are those of a short link. A real long link's timer backs off from
a larger start, so at long delays these runs are TCP's shortest waits, not its longest.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nebula_mq.bench.transport_report import LINK_DOWN_KINDS, render_recovery
from nebula_mq.bench.wan_jobs import MIB, RECOVERY_FLOW, BenchConfig
from nebula_mq.bench.wan_netns import netns_brokers, relay_dir
from nebula_mq.bench.wan_recovery import finish, recovery_grid, summarize
from nebula_mq.errors import NebulaError
from nebula_mq.stack.wan import apply_shape

# Run inside a namespace: rabbitmqctl must reach that namespace's own epmd and node.
_CTL = ("import sys; from nebula_mq.stack import Stack; "
        "print(Stack.open(sys.argv[1]).rabbitmqctl(sys.argv[2], *sys.argv[3:]), end='')")


class LinkDownStack:
    """What :func:`nebula_mq.bench.wan_recovery.recovery` drives, over two namespaced brokers:
    ``drop`` sets the kernel link down, ``cut`` resets through the relays, ``heal`` ends both."""

    def __init__(self, hosts: dict[str, Any], stacks: dict[str, Path], tmp: Path) -> None:
        self.hosts, self.stacks = hosts, stacks
        self.clusters = list(hosts)
        self.relays = {c: relay_dir(tmp, h) for c, h in hosts.items()}
        self.cut_now = False

    def _relays(self, **changes: Any) -> None:
        """The relays' part of the shape (delay and cut; the kernel shapes the rate), applied by both."""
        for c, d in self.relays.items():
            apply_shape(f"relay {c}", d / "control.json", d / "status.json", True, **changes)
        self.cut_now = bool(changes.get("cut", self.cut_now))

    def _link(self, state: str) -> None:
        for h in self.hosts.values():
            h.run("ip", "link", "set", "dev", h.dev, state)

    def link_up(self, cluster: str | None = None, rate_mbit: float = 0.0, delay_ms: float = 0.0) -> None:
        self._link("up")
        if rate_mbit > 0:  # 0: the link as it is (tbf has no "unlimited")
            for h in self.hosts.values():
                h.shape(rate_mbit)
        self._relays(rate_mbit=0.0, delay_ms=delay_ms, cut=False, drop=False)

    def cut(self) -> None:
        self._relays(cut=True)

    def drop(self) -> None:
        self._link("down")

    def heal(self) -> None:
        self._link("up")
        if self.cut_now:
            self._relays(cut=False)

    def rabbitmqctl(self, cluster: str, *args: str) -> str:
        return self.hosts[cluster].run(sys.executable, "-c", _CTL, str(self.stacks[cluster]), cluster, *args).stdout


def link_down_recovery(cfg: BenchConfig, job_id: str, rto_max_ms: int | None = None,
                       say: Any = print) -> list[dict[str, Any]]:
    """``recovery_grid`` over the namespaced brokers: ``drop`` is the kernel link set down; with
    ``rto_max_ms``, TCP's retransmission timeout on both hosts is capped at that."""
    with netns_brokers(job_id, [RECOVERY_FLOW.name], relay_delay_ms=0.0, max_queue_bytes=cfg.recovery_cap_mib * MIB,
                       rto_max_ms=rto_max_ms) as (hosts, job, tmp):
        return recovery_grid(LinkDownStack(hosts, job.stacks, tmp), job, cfg, say)


def run_link_down(args: argparse.Namespace, cfg: BenchConfig) -> int:
    """``--recovery --netns``: the recovery grid over the kernel link, printed and (``--json``) written."""
    t0 = time.monotonic()
    try:
        runs = link_down_recovery(cfg, f"bench-{os.getpid()}-{int(time.time())}-k", args.rto_max_ms)
    except NebulaError as exc:
        print(f"bench transport --recovery --netns failed: {exc}")
        return 1
    result = {"config": asdict(cfg), "rto_max_ms": args.rto_max_ms, "runs": runs, "recovery": summarize(runs),
              "wall_s": time.monotonic() - t0}
    rto = f"TCP's retransmission timeout capped at {args.rto_max_ms} ms" if args.rto_max_ms else "TCP as the kernel ships it"
    return finish(args, result, f"\n{rto} on both broker hosts\n"
                  + render_recovery(result["recovery"], cfg, LINK_DOWN_KINDS))
