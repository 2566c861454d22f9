"""The processes of a local stack: one RabbitMQ node per cluster and the WAN relay in front of
each, started all or nothing and stopped together.

Nodes start and stop in parallel, and each gets its chance whatever the others do, so an error
names every node that failed, not just the first. A start that fails stops again what it had
started (and leaves alone what was running before), and says what it stopped.
"""

from __future__ import annotations

import subprocess

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nebula_mq.errors import StackError
from nebula_mq.security.certs import ClusterCA, federation_identity
from nebula_mq.stack import node as nodes
from nebula_mq.stack import wan
from nebula_mq.stack.layout import NodeLayout, StackLayout


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
        if n.node in nodes_before and _changed_at(ClusterCA(layout.certs_dir, n.cluster).trust_file) >= _started_at(n):
            # A running node re-reads certificate files at each handshake, except CA bundles it
            # already loaded as a TLS client (federation links): a peer CA imported since it
            # started would stay unknown until this, or a restart.
            nodes.rabbitmqctl(n, "eval", "ssl:clear_pem_cache().")


def _started_at(node: NodeLayout) -> float:
    """When the node's VM wrote its pid file (0 when that cannot be read: clear the cache)."""
    try:
        return node.pid_file.stat().st_mtime
    except OSError:
        return 0.0


def _changed_at(path: Path) -> float:
    """When ``path`` last changed (infinitely late when that cannot be read: clear the cache)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return float("inf")


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
