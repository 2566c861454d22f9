"""Hosts on one machine: a network namespace each, joined by veth pairs.

:func:`host_pair` makes two :class:`Host` objects joined by a link the kernel shapes (the
tests make clusters of hosts from the same parts: ``tests.fixtures.netns.cluster_hosts``).
Each host has its own address on its link, its own
loopback (its own epmd and port space) and its own ``/etc/hosts`` (``ip netns exec``
bind-mounts ``/etc/netns/<ns>/hosts``) naming the hosts it reaches, so programs in a namespace
reach another host by name, as on separate machines. A shaped link is shaped with ``tc tbf``
each way (this kernel has no ``netem``: no delay, rate only).

With ``reach_from_here``, each namespace also gets an unshaped veth to this (the root)
namespace, so a program here (a benchmark's producer and consumer) reaches each host's broker at
``Host.local_address`` while the brokers talk to each other over the shaped link only. No
forwarding or firewall rule of this host changes: every address is on a directly attached link.

Needs root and ``ip netns`` (:func:`unusable_reason` says what is missing). Everything is removed
on exit, processes left in the namespaces included.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from nebula_mq.errors import StackError
from nebula_mq.stack.layout import run_command, wait_until

DEFAULT_RATE_MBIT = 500.0


@dataclass(frozen=True)
class Host:
    ns: str
    # The host's end of the shaped link, and its address on it.
    dev: str
    address: str
    hostname: str
    # Its address on the unshaped link to the root namespace ("" without one).
    local_address: str = ""

    def cmd(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *args]

    def run(self, *args: str, timeout: float = 120, check: bool = True,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return run_command(self.cmd(*args), f"[{self.ns}] {' '.join(args)}", timeout, check, cwd=cwd)

    def nebula(self, *args: str, timeout: float = 180, check: bool = True,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``nebula-mq ARGS`` run on this host (in folder ``cwd``)."""
        return self.run(sys.executable, "-m", "nebula_mq", *args, timeout=timeout, check=check, cwd=cwd)

    def tx_bytes(self) -> int:
        return int(self.run("cat", f"/sys/class/net/{self.dev}/statistics/tx_bytes").stdout)

    def shape(self, rate_mbit: float) -> None:
        """What leaves this host on the link: a token bucket at ``rate_mbit`` (a few ms of burst)."""
        burst = max(64 * 1024, int(rate_mbit * 1e6 / 8 * 0.004))
        self.run("tc", "qdisc", "replace", "dev", self.dev, "root", "tbf", "rate", f"{rate_mbit:g}mbit",
                 "burst", str(burst), "latency", "50ms")


def run_here(*args: str) -> None:
    """Run a command in this (the root) namespace; StackError when it fails."""
    run_command(args, " ".join(args), 30)


def unusable_reason() -> str:
    """Why two hosts cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    probe = f"nblprobe{os.getpid()}"
    try:
        run_here("ip", "netns", "add", probe)
    except (StackError, OSError) as exc:
        return f"`ip netns add` fails here ({exc})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return ""


@contextmanager
def host_pair(tag: str, names: tuple[str, str], rate_mbit: float = DEFAULT_RATE_MBIT,
              reach_from_here: bool = False) -> Iterator[tuple[Host, Host]]:
    """Hosts named ``names`` joined by a link shaped to ``rate_mbit`` each way."""
    why = unusable_reason()
    if why:
        raise StackError(f"cannot make two network namespaces: {why}")
    pid = os.getpid() % 10000
    net = f"10.{200 + pid % 50}.{pid % 250}"  # /30s: .1-.2 the shaped link, .5-.6 and .9-.10 to here
    hosts = tuple(Host(f"nbl-{tag}{pid}-{i}", f"nbl{pid}{'ab'[i]}", f"{net}.{i + 1}", names[i],
                       f"{net}.{4 * i + 6}" if reach_from_here else "") for i in range(2))
    here = [f"nbl{pid}h{i}" for i in range(2)]
    try:
        for h in hosts:
            add_namespace(h, {x.hostname: x.address for x in hosts})
        a, b = hosts
        run_here("ip", "link", "add", a.dev, "type", "veth", "peer", "name", b.dev)
        for h in hosts:
            run_here("ip", "link", "set", h.dev, "netns", h.ns)
            h.run("ip", "link", "set", "lo", "up")
            h.run("ip", "addr", "add", f"{h.address}/30", "dev", h.dev)
            h.run("ip", "link", "set", h.dev, "up")
            h.shape(rate_mbit)
        if reach_from_here:
            for i, h in enumerate(hosts):
                inner = f"{h.dev}l"
                run_here("ip", "link", "add", here[i], "type", "veth", "peer", "name", inner)
                run_here("ip", "link", "set", inner, "netns", h.ns)
                run_here("ip", "addr", "add", f"{net}.{4 * i + 5}/30", "dev", here[i])
                run_here("ip", "link", "set", here[i], "up")
                h.run("ip", "addr", "add", f"{h.local_address}/30", "dev", inner)
                h.run("ip", "link", "set", inner, "up")
        yield a, b
    finally:
        remove_hosts(hosts)
        for dev in here:  # gone with its peer's namespace; only a half-made pair is left behind
            subprocess.run(["ip", "link", "del", dev], capture_output=True, timeout=30)


def add_namespace(h: Host, names: dict[str, str]) -> None:
    """The namespace of ``h``, with an ``/etc/hosts`` of ``names`` (hostname -> address)."""
    run_here("ip", "netns", "add", h.ns)
    etc = Path("/etc/netns") / h.ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in names.items()))


def remove_hosts(hosts: Sequence[Host]) -> None:
    for h in hosts:
        _kill_all(h)
        subprocess.run(["ip", "netns", "del", h.ns], capture_output=True, timeout=30)
        shutil.rmtree(Path("/etc/netns") / h.ns, ignore_errors=True)


def _kill_all(h: Host) -> None:
    """Every process still in the namespace (a broker's epmd outlives the broker)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _pids(h)
        if not pids:
            return
        for p in pids:
            with suppress(ProcessLookupError):
                os.kill(p, sig)
        wait_until(lambda: not _pids(h), 10, every=0.2)


def _pids(h: Host) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", h.ns], capture_output=True, text=True, timeout=30)
    return [int(p) for p in out.stdout.split()]
