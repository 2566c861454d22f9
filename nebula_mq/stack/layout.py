"""Where each node of a local stack keeps its files, and which ports it uses; and the probes the
stack's parts share (a free port, a running pid, a command's end, a wait).

Port plan for cluster number ``i`` (0-based) of a stack with base port ``B``:
TLS listener ``B+i``, WAN relay towards that node ``B+10+i``, management API
(HTTPS, loopback only) ``B+30+i``, Erlang distribution ``B+20000+i``. The default ``B = 5681`` stays clear of the system node's
5672/15672/25672. The layout is saved as ``stack.json`` in the run directory so
``stack status|down`` and ``wan ...`` find a running stack without repeating flags.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nebula_mq.errors import StackError
from nebula_mq.atomic import write_json_atomic

DEFAULT_CLUSTERS = ("cluster-a", "cluster-b")
DEFAULT_BASE_PORT = 5681
DEFAULT_PREFIX = "nebula"
RELAY_OFFSET = 10
MGMT_OFFSET = 30
DIST_OFFSET = 20000
# Linux gives outgoing connections local ports from here up (ip_local_port_range). A port up
# there can be taken by any client between a free-port check and a node's bind, or while a
# node restarts: stacks that tools start for themselves stay below it, and so do the gloo
# groups they run (between these bases and their dist ports).
EPHEMERAL_START = 32768
TOOL_BASE_PORTS = range(6000, 12000, 50)  # their dist ports: 26000-31950 (+ cluster)
GROUP_BASE_PORTS = range(12000, 25800, 17)  # a group's ranks take the ports above its base
_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def default_run_dir() -> Path:
    return Path(os.environ.get("NEBULA_RUN_DIR", "run/stack"))


@dataclass(frozen=True)
class NodeLayout:
    """One RabbitMQ node standing for one cluster."""

    cluster: str
    # Erlang node name, unique on this host (several stacks share the default epmd).
    node: str
    tls_port: int
    dist_port: int
    # Port of the relay that forwards to this node's TLS port: peers federate through it.
    relay_port: int
    # Absolute directory holding the node's home, config, mnesia and logs.
    dir: str
    # The management plugin's HTTPS listener on 127.0.0.1 (0: a layout saved before it existed).
    mgmt_port: int = 0

    @property
    def path(self) -> Path:
        return Path(self.dir)

    @property
    def home(self) -> Path:
        return self.path / "home"

    @property
    def mnesia_base(self) -> Path:
        return self.path / "mnesia"

    @property
    def log_base(self) -> Path:
        return self.path / "log"

    @property
    def config_file(self) -> Path:
        return self.path / "rabbitmq.conf"

    @property
    def plugins_file(self) -> Path:
        return self.path / "enabled_plugins"

    @property
    def env_file(self) -> Path:
        return self.path / "rabbitmq-env.conf"

    @property
    def advanced_config_file(self) -> Path:
        return self.path / "advanced.config"

    @property
    def pid_file(self) -> Path:
        return self.mnesia_base / f"{self.node}.pid"


@dataclass(frozen=True)
class StackLayout:
    run_dir: str
    base_port: int
    prefix: str
    nodes: tuple[NodeLayout, ...]
    # The address the nodes' AMQPS listeners also bind, for peers and workers on other hosts
    # (127.0.0.1: this host only). Their loopback listener is always there.
    listen: str = "127.0.0.1"
    # Names the nodes' server certificates carry besides localhost and the cluster name: the
    # hostnames other hosts reach them by.
    hostnames: tuple[str, ...] = ()
    # The address of the management API's listener: loopback, unless the workers that read queue
    # sizes through it run on other machines of the cluster's own network (a compose project).
    management_listen: str = "127.0.0.1"

    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    @property
    def certs_dir(self) -> Path:
        return self.path / "certs"

    @property
    def wan_dir(self) -> Path:
        return self.path / "wan"

    @property
    def clusters(self) -> tuple[str, ...]:
        return tuple(n.cluster for n in self.nodes)

    def node(self, cluster: str) -> NodeLayout:
        for n in self.nodes:
            if n.cluster == cluster:
                return n
        raise StackError(f"unknown cluster {cluster!r}: the stack in {self.run_dir} has "
                         f"{', '.join(self.clusters)}{did_you_mean(cluster, self.clusters)}")

    def save(self) -> None:
        data = {"run_dir": self.run_dir, "base_port": self.base_port, "prefix": self.prefix,
                "nodes": [asdict(n) for n in self.nodes], "listen": self.listen, "hostnames": list(self.hostnames),
                "management_listen": self.management_listen}
        write_json_atomic(self.path / "stack.json", data, indent=2)

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> StackLayout | None:
        path = Path(run_dir).resolve() / "stack.json"
        try:
            data = json.loads(path.read_text())
            nodes = tuple(NodeLayout(**n) for n in data["nodes"])
            return cls(data["run_dir"], int(data["base_port"]), data["prefix"], nodes,
                       str(data.get("listen", "127.0.0.1")), tuple(data.get("hostnames", ())),
                       str(data.get("management_listen", "127.0.0.1")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StackError(f"{path}: unreadable stack layout ({exc})") from None


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """`` (did you mean 'cluster-b'?)`` for the closest of ``known``, or ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def stack_ports(base_port: int, n: int) -> list[int]:
    """Every port a stack of ``n`` nodes at ``base_port`` listens on (see the module docstring)."""
    return [base_port + o + i for o in (0, RELAY_OFFSET, MGMT_OFFSET, DIST_OFFSET) for i in range(n)]


def free_base_port(n: int, seed: int) -> int:
    """A base port for a stack of ``n`` nodes that a benchmark, a study or a test starts for
    itself: every one of its ports free now and below the ephemeral range. ``seed`` (a pid)
    spreads runs that start at the same time over different bases."""
    return _free_base(TOOL_BASE_PORTS, lambda base: stack_ports(base, n), seed, f"{n} nodes' ports")


def free_group_port(n: int, seed: int | None = None) -> int:
    """A base port with ``base .. base + n`` free now: a gloo group's store and ``n`` ranks, that
    a benchmark, a study or a test starts. Below the ephemeral range, where an outgoing
    connection could take a rank's port before the rank binds it (the root's store then never
    starts), and apart from the tools' stacks. ``seed`` (the pid unless given) spreads groups
    that start at the same time over different bases."""
    return _free_base(GROUP_BASE_PORTS, lambda base: range(base, base + n + 1),
                      os.getpid() if seed is None else seed, f"{n + 1} ports", reuse_addr=False)


def _free_base(bases: range, ports: Callable[[int], Iterable[int]], seed: int, what: str,
               reuse_addr: bool = True) -> int:
    """The first of ``bases``, from one that ``seed`` picks on, whose ``ports`` are all free now."""
    for k in range(len(bases)):
        base = bases[(seed * 37 + k) % len(bases)]
        if all(port_free(p, reuse_addr) for p in ports(base)):
            return base
    raise StackError(f"no base port in {bases.start}-{bases.stop} with {what} free")


def port_free(port: int, reuse_addr: bool = True) -> bool:
    """False when something listens on ``port`` of 127.0.0.1. With ``reuse_addr`` (a node's
    ports) TIME_WAIT leftovers of a stopped node do not count; without it (the stricter probe
    for gloo groups' and compose projects' ports) any socket still bound there does."""
    with socket.socket() as s:
        if reuse_addr:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until(done: Callable[[], bool], timeout: float, every: float = 0.1) -> bool:
    """Ask ``done`` every ``every`` seconds until it says True (True) or ``timeout`` has passed
    (False)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True


def running_pid(pid_file: Path, *marks: bytes) -> int | None:
    """The pid in ``pid_file`` while that process runs with every one of ``marks`` in its command
    line; None for a stale pid file (or a pid since taken by another program)."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if all(m in cmdline for m in marks) else None


def run_command(cmd: Sequence[str], what: str, timeout: float, check: bool = True,
                **run: Any) -> subprocess.CompletedProcess[str]:
    """``cmd`` run to its end, its output captured as text; a StackError naming ``what`` when it
    cannot start, outlasts ``timeout`` or (with ``check``) fails."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **run)
    except subprocess.TimeoutExpired:
        raise StackError(f"{what} did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise StackError(f"cannot run {cmd[0]}: {exc}") from None
    if check and out.returncode != 0:
        raise StackError(f"{what} failed ({out.returncode}): {(out.stderr.strip() or out.stdout.strip())[-1500:]}")
    return out


def plan(
    run_dir: str | os.PathLike[str],
    clusters: Sequence[str] = DEFAULT_CLUSTERS,
    base_port: int = DEFAULT_BASE_PORT,
    prefix: str = DEFAULT_PREFIX,
    listen: str = "127.0.0.1",
    hostnames: Sequence[str] = (),
    management_listen: str = "127.0.0.1",
) -> StackLayout:
    """Compute a layout; raises :class:`StackError` on bad names, addresses or ports."""
    for option, address in (("--listen", listen), ("--management-listen", management_listen)):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise StackError(f"{option} must be an IP address of this host, got {address!r}") from None
    for h in hostnames:
        if not _HOSTNAME.match(h):
            raise StackError(f"--hostname must be a DNS name, got {h!r}")
    if not clusters or len(set(clusters)) != len(clusters):
        raise StackError(f"clusters must be distinct and non-empty, got {list(clusters)}")
    if len(clusters) > RELAY_OFFSET:
        raise StackError(f"at most {RELAY_OFFSET} clusters, got {len(clusters)}")
    for name in (*clusters, prefix):
        if not _SLUG.match(name):
            raise StackError(f"names must match {_SLUG.pattern}, got {name!r}")
    if not 1024 <= base_port <= 65535 - DIST_OFFSET - len(clusters):
        raise StackError(f"base port must leave room for +{DIST_OFFSET} dist ports, got {base_port}")
    root = Path(run_dir).resolve()
    nodes = tuple(
        NodeLayout(
            cluster=c,
            node=f"{prefix}-{c}@localhost",
            tls_port=base_port + i,
            dist_port=base_port + DIST_OFFSET + i,
            relay_port=base_port + RELAY_OFFSET + i,
            dir=str(root / "nodes" / c),
            mgmt_port=base_port + MGMT_OFFSET + i,
        )
        for i, c in enumerate(clusters)
    )
    return StackLayout(str(root), base_port, prefix, nodes, listen, tuple(hostnames), management_listen)
