"""Shared fixtures. Broker fixtures live in tests/fixtures and start real nodes."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

# Session fixture `stack`: two TLS RabbitMQ nodes joined by federation through the WAN relay.
pytest_plugins = ["tests.fixtures.stack"]


def _children(pid: int) -> set[int]:
    """All descendants of ``pid``, read from /proc (no psutil dependency)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    out: set[int] = set()
    stack = [pid]
    while stack:
        for child in kids.get(stack.pop(), []):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


@pytest.fixture(autouse=True)
def _kill_stray_children() -> Iterator[None]:
    """Kill processes a test started and left running (workers, relays).

    Broker nodes started by session fixtures are daemonised (-detached) and
    re-parented to init, so they are not our children and survive this.
    """
    before = _children(os.getpid())
    yield
    for pid in _children(os.getpid()) - before:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
