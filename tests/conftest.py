"""Shared fixtures. Broker fixtures live in tests/fixtures and start real nodes."""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator

import pytest

# Session fixtures: `stack` (two TLS RabbitMQ nodes joined by federation through the WAN relay)
# and `real_corpus` (a small real es->en corpus, tokenized); `pair`: two workers on an in-memory broker.
pytest_plugins = ["tests.fixtures.stack", "tests.fixtures.corpus", "tests.fixtures.channels",
                  "tests.fixtures.metrics"]


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


@pytest.fixture(autouse=True)
def _restore_signal_mask() -> Iterator[None]:
    """Put back the signal mask a test found. A test that runs ``nebula-mq worker`` in process
    (its error paths) holds SIGINT and SIGTERM as a worker's start does; every later test of the
    same pytest process, and every child it starts, would find them held and never stop on them."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The CPU-heavy group (``tests/fixtures/lanes.py``) first: it is the longest piece of work
    one xdist worker runs in turn, so it starts at once while the other worker takes the rest;
    a test marked ``last_in_lane`` goes to the end of its group."""
    def key(item: pytest.Item) -> tuple[bool, str, bool]:
        group = item.get_closest_marker("xdist_group")
        name = str(group.args[0]) if group and group.args else ""
        # "cpu-heavy" sorts before the other groups' names.
        return group is None, name, item.get_closest_marker("last_in_lane") is not None

    items.sort(key=key)


def pytest_configure(config: pytest.Config) -> None:
    """``--dist loadgroup`` keeps each xdist group on one worker by a suffix xdist writes into the
    test ids; pytest 9.2 ignores that write and xdist 3.8 does not know it
    (pytest-dev/pytest-xdist#1386), so the CPU-heavy tests (``tests/fixtures/lanes.py``) would
    run side by side past their deadlines. pyproject.toml pins pytest below 9.2; a machine that
    has the pair anyway stops here, in one line."""
    if config.getoption("dist", default="no") != "loadgroup" or hasattr(config, "workerinput"):
        return  # only the controller, once
    from importlib.metadata import version

    def release(name: str) -> tuple[int, ...]:
        return tuple(int(p) for p in version(name).split(".")[:2] if p.isdigit())

    if release("pytest") >= (9, 2) and release("pytest-xdist") < (3, 9):
        pytest.exit(f"pytest {version('pytest')} with pytest-xdist {version('pytest-xdist')} does not keep "
                    "--dist loadgroup's groups on one worker (pytest-xdist#1386): install pytest<9.2 "
                    "(pyproject.toml's pin, as ./dev.sh setup does)", returncode=4)


_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


def pytest_unconfigure(config: pytest.Config) -> None:
    """The process must exit once the summary is printed.

    A non-daemon thread a test left running (a worker blocked on a peer that
    died) would keep the interpreter alive for ever after the summary. Print
    where each such thread is stuck and leave with pytest's own exit status.
    """
    stuck = [t for t in threading.enumerate()
             if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    if not stuck:
        return
    frames = sys._current_frames()
    sys.stderr.write(f"\n{len(stuck)} non-daemon thread(s) still running after the session; exiting anyway:\n")
    for t in stuck:
        frame = frames.get(t.ident or -1)
        sys.stderr.write(f"--- {t.name}\n" + ("".join(traceback.format_stack(frame)) if frame else "") + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(_exit_status[-1] if _exit_status else 1)
