"""Deadlines for collectives and the rendezvous ports' checks, shared by paddle's and torch's groups.

gloo has no membership change: when a rank dies, the others block in their next
collective, and a rendezvous with a rank that never comes blocks in its TCP store.
Every collective and rendezvous runs under :func:`deadline`; past it the process
prints where it waited and exits with code 1, so the launcher restarts the group
from its last common checkpoint. Paddle's blocking calls hold the GIL, so the
watchdog is :mod:`faulthandler`'s, which runs in C. Importing this module imports
no framework.
"""

from __future__ import annotations

import faulthandler
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nebula_mq.errors import WorkerError
from nebula_mq.runtime.logs import get_logger

log = get_logger(__name__)

DEFAULT_TIMEOUT_S = 300.0
# Linux's range of local ports for outgoing connections (32768-60999 unless tuned).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@contextmanager
def deadline(what: str, rank: int, timeout_s: float) -> Iterator[None]:
    """Run a blocking collective; past ``timeout_s`` the process dumps where it waited (the
    collective's function under a ``Timeout`` line) and exits with code 1."""
    log.debug("group_wait", what=what, rank=rank, timeout_s=timeout_s)
    faulthandler.dump_traceback_later(timeout_s, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


class JoinedGroup:
    """A joined group's place in it and its deadline, and how its collectives run."""

    def __init__(self, rank: int, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s

    def _run(self, what: str, collective: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """``collective(*args, **kwargs)`` under :func:`deadline`; what the framework raises is one
        :class:`WorkerError` line naming ``what`` and this rank."""
        try:
            with deadline(what, self.rank, self.timeout_s):
                collective(*args, **kwargs)
        except (RuntimeError, OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkerError(f"{what} failed on rank {self.rank}: {first}") from None


def ephemeral_ports(source: Path = EPHEMERAL_RANGE_FILE) -> range | None:
    """The kernel's ephemeral port range; None where it cannot be read (not Linux)."""
    try:
        low, high = (int(v) for v in source.read_text().split())
    except (OSError, ValueError):
        return None
    return range(low, high + 1)


def warn_ephemeral_ports(addresses: Sequence[str], source: Path = EPHEMERAL_RANGE_FILE) -> list[int]:
    """Warn about rendezvous ports inside the ephemeral range, and return them. Any outgoing
    connection on the host (a worker's own broker connections) may be given such a port
    before the rank binds it; the rank then fails to listen, and the group never forms."""
    ephemeral = ephemeral_ports(source)
    if ephemeral is None:
        return []
    ports = sorted({int(a.rpartition(":")[2]) for a in addresses} & set(ephemeral))
    if ports:
        log.warning("gloo_ports_in_ephemeral_range", ports=ports,
                    ephemeral=f"{ephemeral.start}-{ephemeral.stop - 1}",
                    hint=f"an outgoing connection may take them first; choose ports below {ephemeral.start}")
    return ports


def is_endpoint(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
