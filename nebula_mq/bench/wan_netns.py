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
from nebula_mq.bench.wan_jobs import A, B, IDENTITIES, MIB, BenchConfig, goodput_flows
from nebula_mq.bench.wan_transfer import goodput_points
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
    nebula_mq.bench.wan_netns provision ...`` runs this)."""
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
                h.run(sys.executable, "-m", "nebula_mq.bench.wan_netns", "provision", str(stacks[c]), c, job_id,
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


def compare(relay: Sequence[dict[str, Any]], netns: Sequence[dict[str, Any]]) -> list[str]:
    """The two WAN emulations side by side: goodput as a share of the link, and their ratio."""
    def point(r: dict[str, Any]) -> tuple[float, int, int]:
        return r["rate_mbit"], r["payload_bytes"], r.get("stripes", 1)

    by_point = {point(r): r for r in relay}
    lines = [f"{'link Mbit/s':>11} {'size':>7} {'stripes':>7} {'relay %':>8} {'kernel %':>9} {'kernel/relay':>13}"]
    for n in netns:
        r = by_point.get(point(n))
        rp = f"{r['percent']:8.1f}" if r else f"{'-':>8}"
        ratio = f"{n['percent'] / r['percent']:13.2f}" if r and r["percent"] > 0 else f"{'-':>13}"
        lines.append(f"{n['rate_mbit']:11g} {n['payload_bytes'] // MIB:5d} M {n.get('stripes', 1):7d} {rp} "
                     f"{n['percent']:9.1f} {ratio}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) == 7 and argv[0] == "provision":
        provision_here(argv[1], argv[2], argv[3], json.loads(argv[4]), int(argv[5]), int(argv[6]))
        return 0
    print("usage: python -m nebula_mq.bench.wan_netns provision STACK_DIR CLUSTER JOB_ID FLOWS_JSON PEER_PORT "
          "MAX_QUEUE_BYTES", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
