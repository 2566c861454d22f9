"""The local multi-cluster stack: TLS-only RabbitMQ nodes joined by federation over relays.

Usage::

    stack = Stack("run/stack")               # cluster-a and cluster-b, ports 5681/5682
    stack.up()                               # idempotent; returns when every node is ready
    stack.provision_job("demo", abnet_flows("cluster-a", "cluster-b", ("enc-0",)),
                        {"cluster-a": ["enc-0"], "cluster-b": ["dec-0"]})
    settings = stack.broker_settings("cluster-a", "enc-0", vhost=topology.vhost("demo"))
    stack.cut(); stack.heal()                # the emulated WAN
    stack.down()

The processes of a stack, one RabbitMQ node per cluster and the WAN relay in front of each, are
started all or nothing (:func:`start_all`) and stopped together (:func:`stop_all`). Nodes start
and stop in parallel, and each gets its chance whatever the others do, so an error names every
node that failed, not just the first. A start that fails stops again what it had started (and
leaves alone what was running before), and says what it stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from nebula_mq import topology
from nebula_mq.errors import StackError
from nebula_mq.security.certs import ClusterCA, federation_identity, init_certs
from nebula_mq.security.keys import ensure_secret
from nebula_mq.security.trust import PeerChain, refresh_peer, trust_peer
from nebula_mq.settings import BrokerSettings, TransportSettings
from nebula_mq.stack import node as nodes
from nebula_mq.stack import provision, wan
from nebula_mq.stack.admin import BrokerAdmin, local_admin
from nebula_mq.stack.layout import NodeLayout, StackLayout, default_run_dir, plan
from nebula_mq.stack.relay import Shape
from nebula_mq.topology import Flow
from nebula_mq.transport.links import FederationLink, LinkWatch, links_from


@dataclass(frozen=True)
class NodeStatus:
    cluster: str
    node: str
    running: bool
    tls_port: int
    relay_port: int
    # Relay in front of this node: its pid (None = not running) and current shape.
    relay_pid: int | None
    shape: Shape
    # The management API's HTTPS port on loopback (0: none).
    mgmt_port: int = 0


@dataclass(frozen=True)
class QueueDepth:
    messages: int
    message_bytes: int


class Stack:
    """A set of local nodes, one per cluster, with the relays between them."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        clusters: Sequence[str] | None = None,
        base_port: int | None = None,
        prefix: str | None = None,
        listen: str | None = None,
        hostnames: Sequence[str] | None = None,
        management_listen: str | None = None,
    ) -> None:
        """Plan a stack in ``run_dir`` (default ``$NEBULA_RUN_DIR`` or ``run/stack``).

        ``listen`` and ``hostnames``: the address the nodes also listen on and the names
        their certificates carry, for a node that other hosts reach (one cluster per host).
        What is not given is the saved stack's (a stopped one started with ``--base-port``
        comes back on its ports), else the default. If a stack with another layout is
        already running there, it keeps its own layout (ports, prefix) until ``down``.
        """
        root = Path(run_dir) if run_dir is not None else default_run_dir()
        saved = StackLayout.load(root)
        given: dict[str, Any] = {"clusters": clusters, "base_port": base_port, "prefix": prefix, "listen": listen,
                                 "hostnames": hostnames, "management_listen": management_listen}
        fresh = plan(root, **{k: getattr(saved, k) if v is None else v for k, v in given.items()
                              if v is not None or saved is not None})  # else plan()'s default
        if saved is not None and saved != fresh and any(nodes.is_running(n) for n in saved.nodes):
            # A running stack keeps its layout; ask for `down` before changing it.
            self.layout = saved
        else:
            self.layout = fresh

    @classmethod
    def open(cls, run_dir: str | os.PathLike[str] | None = None) -> Stack:
        """The stack saved in ``run_dir`` (by a previous ``up``), with its own layout."""
        root = Path(run_dir) if run_dir is not None else default_run_dir()
        if StackLayout.load(root) is None:
            raise StackError(f"no stack in {root.resolve()} (run `nebula-mq stack up` first)")
        return cls(root)  # what is not given is the saved stack's

    @property
    def clusters(self) -> tuple[str, ...]:
        return self.layout.clusters

    def ca(self, cluster: str) -> ClusterCA:
        self.layout.node(cluster)
        return ClusterCA(self.layout.certs_dir, cluster)

    # ------------------------------------------------------------------ lifecycle

    def up(self, timeout: float = 90.0) -> None:
        """Create certificates, render configs, start nodes and relays; wait until ready.
        Nodes already running reload their certificates (after ``certs import-ca``, say).
        All or nothing (:func:`start_all`): a :class:`StackError` names the failure (a busy
        port, a node that does not boot) and what this call had started and stopped again.
        """
        self._prepare()
        start_all(self.layout, timeout)

    def _prepare(self) -> None:
        """Save the layout, make the certificates and CRLs, render every node's config."""
        self.layout.save()
        init_certs(self.layout.certs_dir, self.clusters)
        listen = self.layout.listen
        # The listen address goes into the certificate, unless it is "every address".
        names = [*self.layout.hostnames, *([listen] if listen not in ("127.0.0.1", "0.0.0.0", "::") else [])]
        for n in self.layout.nodes:
            nodes.render(n, self.ca(n.cluster).ensure_server(names), listen, self.layout.management_listen)

    def serve(self) -> NoReturn:
        """Run this one-cluster stack's node in the foreground, as a container's main process:
        certificates and config as ``up`` makes them, then RabbitMQ replaces this process (it
        stops on SIGTERM). No WAN relay: the peers reach the node at its published port."""
        if len(self.layout.nodes) != 1:
            raise StackError(f"the foreground mode runs one cluster's node, got {', '.join(self.clusters)}: "
                             f"pass --clusters NAME")
        self._prepare()
        nodes.exec_foreground(self.layout.nodes[0])

    def down(self) -> None:
        """Stop relays and nodes; leaves nothing of this stack running."""
        stop_all(self.layout)

    def status(self) -> dict[str, NodeStatus]:
        out = {}
        for n, link in zip(self.layout.nodes, wan.links(self.layout)):
            out[n.cluster] = NodeStatus(n.cluster, n.node, nodes.is_running(n), n.tls_port,
                                        n.relay_port, link.pid(), link.shape(), n.mgmt_port)
        return out

    def restart_node(self, cluster: str, timeout: float = 90.0) -> None:
        """Stop and start one node (its relay stays; federation links reconnect)."""
        n = self.layout.node(cluster)
        nodes.stop(n)
        nodes.start(n, timeout)

    def rabbitmqctl(self, cluster: str, *args: str, timeout: float = 60.0) -> str:
        return nodes.rabbitmqctl(self.layout.node(cluster), *args, timeout=timeout)

    def admin(self, cluster: str) -> BrokerAdmin:
        """``cluster``'s node as its administrator (what provisioning applies definitions through)."""
        return local_admin(self.layout.node(cluster), self.ca(cluster), self.layout.management_listen)

    # ------------------------------------------------------------------ clients

    def broker_settings(self, cluster: str, identity: str, vhost: str = "/", heartbeat_s: int = 30,
                        host: str = "") -> BrokerSettings:
        """TLS settings for worker ``identity`` on its local ``cluster`` (issues its cert if needed).
        The worker reaches the node on loopback, or at ``host``: one of the names in the node's
        certificate (``--hostname``), for a worker on another machine or container."""
        n = self.layout.node(cluster)
        if host and host not in ("localhost", "127.0.0.1", cluster, *self.layout.hostnames):
            raise StackError(f"{cluster}'s broker certificate does not name {host!r} (it names localhost, "
                             f"{', '.join((cluster, *self.layout.hostnames))}): start the stack with --hostname {host}")
        ident = self.ca(cluster).ensure_client(identity)
        settings = BrokerSettings(host=host or "127.0.0.1", port=n.tls_port, vhost=vhost, tls=True,
                                  ca_file=str(ident.ca_file), cert_file=str(ident.cert_file),
                                  key_file=str(ident.key_file), server_name=host or "localhost",
                                  heartbeat_s=heartbeat_s)
        password = self.monitoring_password_file(vhost)
        job_id = topology.job_of_vhost(vhost)
        if n.mgmt_port and job_id and password.is_file():
            # A provisioned job: its workers read queue sizes as the job's monitoring user.
            settings = replace(settings, management_port=n.mgmt_port, management_user=topology.monitoring_user(job_id),
                               management_password_file=str(password))
        return settings

    def monitoring_password_file(self, vhost: str) -> Path:
        """The password of a job's read-only management user (0600; made by ``provision_job``)."""
        return self.layout.path / "monitoring" / f"{vhost}.password"

    def provision_job(
        self,
        job_id: str,
        flows: Sequence[Flow],
        identities: Mapping[str, Sequence[str]] | None = None,
        max_queue_bytes: int = TransportSettings().max_queue_bytes,
    ) -> str:
        """Create the job's vhost, users, upstreams and federation policy on every cluster.

        ``identities`` maps a cluster to the worker identities (certificate CNs) that
        connect there. ``max_queue_bytes`` caps the sending-side copy of each
        cross-cluster flow (the backpressure point; see ``nebula_mq.topology``) and
        is the cap argument of each local flow's queue, created here with its
        publish exchange: pass the workers' ``TransportSettings.max_queue_bytes``.
        Idempotent. Returns the job's vhost.
        """
        identities = identities or {}
        for c in (*identities, *(f.src_cluster for f in flows), *(f.dst_cluster for f in flows)):
            self.layout.node(c)
        try:
            vhost = topology.vhost(job_id)
            for f in flows:
                topology.queue_name(job_id, f.name)
        except ValueError as exc:
            raise StackError(str(exc)) from None
        monitoring_password = ensure_secret(self.monitoring_password_file(vhost))
        upstreams = {}
        for n in self.layout.nodes:
            for peer in self.clusters:
                if peer != n.cluster:
                    client = self.ca(peer).ensure_client(federation_identity(peer))
                    upstreams[(peer, n.cluster)] = provision.Upstream(n.cluster, "127.0.0.1", n.relay_port, client)

        def apply(cluster: str) -> None:
            for cn in identities.get(cluster, ()):
                self.ca(cluster).ensure_client(cn)
            peers = [p for p in self.clusters if p != cluster]
            ups = {src: up for (dst, src), up in upstreams.items() if dst == cluster}
            defs = provision.definitions(job_id, cluster, flows, identities.get(cluster, ()), peers, ups,
                                         max_queue_bytes, monitoring_password)
            self.admin(cluster).import_definitions(defs)

        with ThreadPoolExecutor(len(self.clusters)) as pool:
            list(pool.map(apply, self.clusters))
        return vhost

    def trust_peer(self, cluster: str, peer: str, host: str, port: int, fingerprint: str | None) -> PeerChain:
        """``cluster`` trusts ``peer``, whose broker answers at ``host:port``: its CA (pinned by
        ``fingerprint``; None: the CA trusted already, its CRL refreshed) and CRL read from that
        broker's handshake (``security.trust``). A running node takes them at once."""
        ca = self.ca(cluster)
        chain = (trust_peer(ca, peer, host, port, fingerprint) if fingerprint is not None
                 else refresh_peer(ca, peer, host, port))
        node = self.layout.node(cluster)
        if nodes.is_running(node):  # the CA bundle a running node loaded as a federation client
            nodes.rabbitmqctl(node, "eval", "ssl:clear_pem_cache().")
        return chain

    def federation_links(self, cluster: str, vhost: str = "") -> list[FederationLink]:
        """``cluster``'s node's federation links from its peers (``vhost``'s only when given),
        each with how long it has been down (remembered in the stack directory across commands)."""
        rows = self.admin(cluster).federation_links()
        return LinkWatch(self.layout.path / "links.json").seen(links_from(cluster, rows, vhost))

    def queue_depths(self, cluster: str, vhost: str) -> dict[str, QueueDepth]:
        out = self.rabbitmqctl(cluster, "list_queues", "-p", vhost, "name", "messages", "message_bytes",
                               "--formatter", "json", "--quiet")
        try:
            rows: list[dict[str, Any]] = json.loads(out or "[]")
            # A stream (the job's status feed) reports no message_bytes: "" counts as none held.
            return {r["name"]: QueueDepth(int(r["messages"] or 0), int(r["message_bytes"] or 0)) for r in rows}
        except (ValueError, KeyError, TypeError) as exc:
            raise StackError(f"{cluster}: unexpected list_queues output ({exc}): {out[:200]!r}") from None

    # ------------------------------------------------------------------ the emulated WAN

    def shape(self, cluster: str | None = None, **changes: Any) -> None:
        """Change the link(s) towards ``cluster`` (all when None): rate_mbit, delay_ms, cut, drop."""
        for link in wan.links(self.layout, cluster):
            link.set_shape(**changes)

    def link_up(self, cluster: str | None = None, **shape: float) -> None:
        """The link(s) up, shaped by ``shape`` (rate_mbit, delay_ms): no outage of any kind left."""
        self.shape(cluster, cut=False, drop=False, **shape)

    def cut(self, cluster: str | None = None) -> None:
        """Reset every connection across the link(s) and refuse new ones until ``heal``."""
        self.shape(cluster, cut=True)

    def drop(self, cluster: str | None = None) -> None:
        """Blackhole the link(s) until ``heal``: connections stay open, no byte crosses."""
        self.shape(cluster, drop=True)

    def heal(self, cluster: str | None = None) -> None:
        """End a cut and a drop alike, the shape kept."""
        self.link_up(cluster)

    def wan_status(self) -> dict[str, dict[str, Any]]:
        return {link.name: link.status() for link in wan.links(self.layout)}


def start_all(layout: StackLayout, timeout: float) -> None:
    """Start every node and relay of ``layout`` not running yet and wait until each node serves
    TLS; all or nothing (see the module docstring). Nodes already running reload their
    certificates."""
    links = wan.links(layout)
    nodes_before = {n.node for n in layout.nodes if nodes.is_running(n)}
    relays_before = {link.name for link in links if link.pid() is not None}
    try:
        _start(layout, links, timeout)
    except BaseException as exc:
        rollback = _stop_started(layout, links, nodes_before, relays_before)
        if isinstance(exc, StackError):
            raise StackError(f"{exc}; {rollback}") from None
        raise
    for n in layout.nodes:
        # A running node re-reads certificate files at each handshake, except CA bundles it
        # already loaded as a TLS client (federation links): a peer CA imported since it
        # started (its pid file's time) would stay unknown until this, or a restart. A time
        # that cannot be read clears the cache.
        trust_changed = _mtime(ClusterCA(layout.certs_dir, n.cluster).trust_file, float("inf"))
        if n.node in nodes_before and trust_changed >= _mtime(n.pid_file, 0.0):
            nodes.rabbitmqctl(n, "eval", "ssl:clear_pem_cache().")


def _mtime(path: Path, unreadable: float) -> float:
    """When ``path`` last changed; ``unreadable`` when that cannot be read."""
    try:
        return path.stat().st_mtime
    except OSError:
        return unreadable


def stop_all(layout: StackLayout) -> None:
    """Stop every relay and node of ``layout``; leaves nothing of it running: not even the
    Erlang port mapper the first node started, once no node on this host uses it."""
    for link in wan.links(layout):
        link.stop()
    errors = [e for e in each_node(nodes.stop, layout.nodes) if e]
    if errors:
        raise StackError("; ".join(errors))
    _stop_idle_epmd()


def _stop_idle_epmd() -> None:
    """``epmd -kill`` when no Erlang node is registered with it (the system RabbitMQ, another
    stack: theirs stays), so a stack taken down leaves no process behind."""
    try:
        names = subprocess.run(["epmd", "-names"], capture_output=True, text=True, timeout=10)
        if names.returncode == 0 and "up and running" in names.stdout and " at port " not in names.stdout:
            subprocess.run(["epmd", "-kill"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        pass  # no epmd here, or it does not answer: nothing of ours to stop


def _start(layout: StackLayout, links: Sequence[wan.Link], timeout: float) -> None:
    errors = [e for e in each_node(lambda n: nodes.start(n, timeout), layout.nodes) if e]
    if errors:
        raise StackError("; ".join(errors))
    for link in links:
        if link.pid() is None and not nodes.port_free(link.node.relay_port):
            raise StackError(f"relay {link.name}: WAN relay port {link.node.relay_port} is already in use "
                             f"(another stack or service?)")
        link.start()
    for n in layout.nodes:
        nodes.tls_probe(n, ClusterCA(layout.certs_dir, n.cluster).client(federation_identity(n.cluster)))


def _stop_started(layout: StackLayout, links: Sequence[wan.Link], nodes_before: set[str],
                  relays_before: set[str]) -> str:
    """Stop the relays and nodes not in ``*_before``; says what was stopped (for the error)."""
    stopped: list[str] = []
    failed: list[str] = []
    for link in links:
        if link.name not in relays_before and link.pid() is not None:
            try:
                link.stop()
                stopped.append(f"relay {link.name}")
            except (OSError, StackError) as exc:
                failed.append(f"relay {link.name} ({exc})")
    started = [n for n in layout.nodes if n.node not in nodes_before and nodes.is_running(n)]
    for n, error in zip(started, each_node(nodes.stop, started)):
        if error:
            failed.append(f"node {n.node} ({error})")
        else:
            stopped.append(f"node {n.node}")
    text = (f"stopped what this `stack up` had started ({', '.join(stopped)})" if stopped
            else "this `stack up` had started nothing else")
    if failed:
        text += f"; could NOT stop {', '.join(failed)}: `nebula-mq stack down --stack {layout.run_dir}`"
    return text


def each_node(action: Callable[[NodeLayout], object], ns: Sequence[NodeLayout]) -> list[str]:
    """``action`` on every node in parallel; one entry per node: its StackError, or "" on success."""
    def run(n: NodeLayout) -> str:
        try:
            action(n)
        except StackError as exc:
            return str(exc)
        return ""

    if not ns:
        return []
    with ThreadPoolExecutor(len(ns)) as pool:
        return list(pool.map(run, ns))
