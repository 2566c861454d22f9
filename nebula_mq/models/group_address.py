"""Where a group's ranks meet: one rendezvous, one address per rank, on one host or many.

A side's group (a split side's ranks, ELECTRA's discriminator ranks) may span the hosts of
its cluster. Every rank is given the same :class:`GroupAddress`: rank ``r`` listens on
``hosts[r]:base_port + 1 + r`` and the rendezvous (the TCP store rank 0 serves) is on
``hosts[0]:base_port``. Ranks talk to each other inside the cluster; only the broker talks
across the WAN.

gloo and NCCL bind to whatever interface the host name resolves to unless told otherwise,
and on a host with several interfaces (or in a network namespace) that may be one the other
hosts cannot reach. :meth:`GroupAddress.bind_env` names the interface that holds this
rank's own address (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``), unless the user set
them; a rank started on a host that does not have its address is refused in one line
before it joins. Importing this module imports no framework.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nebula_mq.errors import WorkerError

SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface


@dataclass(frozen=True)
class GroupAddress:
    """The rendezvous (``master``) and each rank's ``host:port`` (``endpoints``, rank order)."""

    master: str
    endpoints: tuple[str, ...]

    @classmethod
    def on_hosts(cls, hosts: Sequence[str], base_port: int) -> GroupAddress:
        """Rank ``r`` on ``hosts[r]``, port ``base_port + 1 + r``; the rendezvous on rank 0's host."""
        if not hosts:
            raise WorkerError("a group needs at least one rank")
        return cls(f"{hosts[0]}:{base_port}", tuple(f"{h}:{base_port + 1 + r}" for r, h in enumerate(hosts)))

    @property
    def world(self) -> int:
        return len(self.endpoints)

    def host_of(self, rank: int) -> str:
        return self.endpoints[rank].rpartition(":")[0]

    def bind_env(self, rank: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The variables that bind gloo and NCCL to the interface holding rank ``rank``'s
        address (empty on loopback, or where the user chose the interfaces already)."""
        env = os.environ if environ is None else environ
        host = self.host_of(rank)
        address = resolve(host)
        if ipaddress.ip_address(address).is_loopback:
            return {}
        interface = interface_with(address)
        if interface is None:
            raise WorkerError(f"rank {rank} is placed on {host} ({address}), which is not an address of this "
                              f"host ({socket.gethostname()}): start rank {rank} on {host}, or fix the "
                              f"job's hosts list")
        return {name: interface for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if name not in env}


def resolve(host: str) -> str:
    """``host``'s IPv4 address; a name that does not resolve is one line, not a traceback."""
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise WorkerError(f"cannot resolve the group host {host!r}: {exc}") from None


def interface_with(address: str) -> str | None:
    """The name of this host's interface that holds IPv4 ``address`` (None: no such interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None
