"""The transport benchmark over a WAN the kernel emulates: each cluster's broker in a network
namespace of its own (``nebula_mq.stack.netns``), federated by hostname over a veth pair shaped
with ``tc tbf``, the way two hosts are deployed (``stack up --listen --hostname``, CA and CRL
exchange, provisioning with the peer named by hostname). The producer and the consumer run
here and reach each broker over an unshaped link of its own, so only the brokers' federation
link crosses the shaped one. ``bench transport --netns`` runs it beside the relay's goodput
points, at the same rates and sizes, in the same run.

The kernel shapes the rate only (no ``netem`` here). With ``--delay-ms``, a relay in front of each
broker, listening on its host's link address, adds the delay to the federation link (unlimited
rate), so both emulations are compared at the same delay.

``bench transport --recovery --netns`` runs the recovery grid over that link. The stack's relay
emulates a non-resetting drop by holding every byte and releasing it at the heal: TCP's best
case. Here ``drop`` sets the veth down on both ends: packets are lost, not held, nothing is
reset, and each connection comes back on TCP's own retransmission timer. ``reset`` runs beside
it on the same hosts: the relay in front of each broker resets every connection across it and
refuses new ones, as the stack's cut does. The delay is the relays' (added above TCP), so the
connections across the veth see a round trip of well under a millisecond, and their
retransmission timeouts are those of a short link. A real long link's timer backs off from
a larger start, so at long delays these runs are TCP's shortest waits, not its longest.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nebula_mq import topology
from nebula_mq.bench.transport_recovery import recovery_grid
from nebula_mq.bench.transport_runs import (A, B, IDENTITIES, MIB, RECOVERY_FLOW, BenchConfig, goodput_flows,
                                            goodput_points)
from nebula_mq.settings import BrokerSettings, TransportSettings
from nebula_mq.topology import Flow

HOSTNAMES = {A: "broker-a.nebula.test", B: "broker-b.nebula.test"}
# TCP's retransmission timeout cap (Linux 6.15+), per network namespace.
RTO_MAX_SYSCTL = Path("/proc/sys/net/ipv4/tcp_rto_max_ms")
PORT = 5671  # each namespace has its own port space
RELAY_PORT = 5673  # the delaying relay in front of a broker, on its host's link address


@dataclass(frozen=True)
class NetnsJob:
    """The bench job on the two namespaced brokers, as the producer and consumer here reach them."""

    job_id: str
    stacks: dict[str, Path]
    addresses: dict[str, str]

    def settings(self, cluster: str, identity: str) -> BrokerSettings:
        from nebula_mq.security.certs import ClusterCA

        ident = ClusterCA(self.stacks[cluster] / "certs", cluster).ensure_client(identity)
        return BrokerSettings(host=self.addresses[cluster], port=PORT, vhost=topology.vhost(self.job_id), tls=True,
                              ca_file=str(ident.ca_file), cert_file=str(ident.cert_file), key_file=str(ident.key_file),
                              server_name=HOSTNAMES[cluster], heartbeat_s=30)


def provision_here(stack_dir: str, cluster: str, job_id: str, flow_names: Sequence[str], peer_port: int,
                   max_queue_bytes: int) -> None:
    """Inside ``cluster``'s namespace: the bench job on its broker, the peer named by hostname at
    ``peer_port``, each flow's sending-side copy capped at ``max_queue_bytes`` (``python -m
    nebula_mq.bench.transport_netns provision ...`` runs this)."""
    from nebula_mq.security.certs import federation_identity
    from nebula_mq.stack import Stack, provision

    flows = [Flow(name, A, B) for name in flow_names]
    stack = Stack.open(stack_dir)
    peer = B if cluster == A else A
    own = stack.ca(cluster).ensure_client(federation_identity(cluster))
    upstreams = {peer: provision.Upstream(peer, HOSTNAMES[peer], peer_port, own, HOSTNAMES[peer])}
    workers = IDENTITIES[cluster]
    for cn in workers:
        stack.ca(cluster).ensure_client(cn)
    stack.admin(cluster).import_definitions(
        provision.definitions(job_id, cluster, flows, workers, [peer], upstreams, max_queue_bytes=max_queue_bytes))


def _exchange_trust(stacks: dict[str, Path]) -> None:
    """What the two operators mail each other: CA certificates and CRLs (files only)."""
    from nebula_mq.security.certs import ClusterCA, import_peer_ca, init_certs
    from nebula_mq.security.revocation import crl_dir, import_peer_crl, write_crl

    cas = {c: init_certs(d / "certs", [c])[c] for c, d in stacks.items()}
    for dst, src in ((A, B), (B, A)):
        import_peer_ca(cas[dst], src, cas[src].ca_cert_file.read_bytes())
        crl_dir(stacks[src] / "certs").mkdir(parents=True, exist_ok=True)
        crl = write_crl(ClusterCA(stacks[src] / "certs", src), crl_dir(stacks[src] / "certs")).read_bytes()
        import_peer_crl(stacks[dst] / "certs", cas[dst], src, crl)


def relay_dir(tmp: Path, host: Any) -> Path:
    """Where the delaying relay in front of ``host``'s broker keeps its control and status files."""
    return tmp / f"relay-{host.ns}"


def _start_delay_relay(host: Any, tmp: Path, delay_ms: float) -> None:
    """A relay on ``host``'s link address in front of its broker: +``delay_ms`` each way, any rate."""
    from nebula_mq.atomic import write_json_atomic
    from nebula_mq.stack.relay import Shape

    d = relay_dir(tmp, host)
    d.mkdir()
    write_json_atomic(d / "control.json", asdict(Shape(rate_mbit=0.0, delay_ms=delay_ms, generation=1)))
    host.run(sys.executable, "-m", "nebula_mq.stack.relay", "--daemon", "--listen-host", host.address,
             "--listen-port", str(RELAY_PORT), "--target", f"127.0.0.1:{PORT}", "--control", str(d / "control.json"),
             "--status", str(d / "status.json"), "--pidfile", str(d / "pid"), "--log", str(d / "log"))


@contextmanager
def netns_brokers(job_id: str, flow_names: Sequence[str], relay_delay_ms: float | None,
                  max_queue_bytes: int = TransportSettings().max_queue_bytes, rto_max_ms: int | None = None
                  ) -> Iterator[tuple[dict[str, Any], NetnsJob, Path]]:
    """Two hosts, a broker each, federated by hostname over the kernel link, the job provisioned:
    yields the hosts by cluster, the job as a producer and consumer here reach it, and the
    temporary directory. With ``relay_delay_ms`` (0 included) the federation crosses a relay in
    front of each broker that adds that delay; without, it reaches the peer's broker directly.
    ``rto_max_ms`` caps TCP's retransmission timeout on both hosts (``net.ipv4.tcp_rto_max_ms``,
    Linux 6.15+), set before any connection opens: a socket takes it when it is made."""
    from nebula_mq.stack.netns import host_pair

    with tempfile.TemporaryDirectory(prefix="nebula-netns-", dir="/tmp") as tmp, \
            host_pair("bn", (HOSTNAMES[A], HOSTNAMES[B]), reach_from_here=True) as (ha, hb):
        hosts = {A: ha, B: hb}
        if rto_max_ms is not None:
            for h in hosts.values():
                h.run("sh", "-c", f"echo {int(rto_max_ms)} > {RTO_MAX_SYSCTL}")
        stacks = {c: Path(tmp) / c for c in hosts}
        _exchange_trust(stacks)
        peer_port = RELAY_PORT if relay_delay_ms is not None else PORT
        try:
            for c, h in hosts.items():
                h.nebula("stack", "up", "--stack", str(stacks[c]), "--clusters", c, "--listen", "0.0.0.0",
                         "--hostname", h.hostname, "--base-port", str(PORT), "--prefix", f"nbn{os.getpid()}")
                if relay_delay_ms is not None:
                    _start_delay_relay(h, Path(tmp), relay_delay_ms)
                h.run(sys.executable, "-m", "nebula_mq.bench.transport_netns", "provision", str(stacks[c]), c, job_id,
                      json.dumps(list(flow_names)), str(peer_port), str(max_queue_bytes))
            yield hosts, NetnsJob(job_id, stacks, {c: h.local_address for c, h in hosts.items()}), Path(tmp)
        finally:
            for c, h in hosts.items():
                h.nebula("stack", "down", "--stack", str(stacks[c]), check=False)


def netns_goodput(cfg: BenchConfig, job_id: str, say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Goodput at ``cfg.rates_mbit`` x ``cfg.sizes_mib`` over the kernel-shaped namespace link,
    with ``cfg.delay_ms`` added by a relay on each host: one row per point, median of
    ``cfg.repeats``, as ``run_bench`` reports the relay's."""
    flows = topology.physical_flows(goodput_flows(cfg))
    with netns_brokers(job_id, [f.name for f in flows], cfg.delay_ms if cfg.delay_ms > 0 else None) as (hosts, job, _):
        def shape(rate: float) -> None:
            for h in hosts.values():
                h.shape(rate)

        return goodput_points(job, cfg, shape, "netns", say, link_bytes=hosts[A].tx_bytes)


# Run inside a namespace: rabbitmqctl must reach that namespace's own epmd and node.
_CTL = ("import sys; from nebula_mq.stack import Stack; "
        "print(Stack.open(sys.argv[1]).rabbitmqctl(sys.argv[2], *sys.argv[3:]), end='')")


class LinkDownStack:
    """What :func:`nebula_mq.bench.transport_recovery.recovery` drives, over two namespaced brokers:
    ``drop`` sets the kernel link down, ``cut`` resets through the relays, ``heal`` ends both."""

    def __init__(self, hosts: dict[str, Any], stacks: dict[str, Path], tmp: Path) -> None:
        self.hosts, self.stacks = hosts, stacks
        self.clusters = list(hosts)
        self.relays = {c: relay_dir(tmp, h) for c, h in hosts.items()}
        self.cut_now = False

    def _relays(self, **changes: Any) -> None:
        """The relays' part of the shape (delay and cut; the kernel shapes the rate), applied by both."""
        from nebula_mq.stack.wan import apply_shape

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


def main(argv: list[str]) -> int:
    if len(argv) == 7 and argv[0] == "provision":
        provision_here(argv[1], argv[2], argv[3], json.loads(argv[4]), int(argv[5]), int(argv[6]))
        return 0
    print("usage: python -m nebula_mq.bench.transport_netns provision STACK_DIR CLUSTER JOB_ID FLOWS_JSON PEER_PORT "
          "MAX_QUEUE_BYTES", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
