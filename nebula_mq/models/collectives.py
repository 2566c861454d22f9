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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from nebula_mq.runtime.logs import get_logger

log = get_logger(__name__)

DEFAULT_TIMEOUT_S = 300.0
# Linux's range of local ports for outgoing connections (32768-60999 unless tuned).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@contextmanager
def deadline(what: str, rank: int, timeout_s: float) -> Iterator[None]:
    """Run a blocking collective; past ``timeout_s`` the process dumps where it waited and exits.

    paddle's collectives hold the GIL while they block, so no Python thread or signal
    handler can run meanwhile: the watchdog is :mod:`faulthandler`'s, which runs in C. Its
    dump names the collective's function (``init_group``, ``allreduce_gradients``,
    ``barrier``, ``min_int``) under a ``Timeout`` line, then it exits with code 1."""
    log.debug("group_wait", what=what, rank=rank, timeout_s=timeout_s)
    faulthandler.dump_traceback_later(timeout_s, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


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
