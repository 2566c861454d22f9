"""A real full file system for the tests of what a worker does on a full disk: a small tmpfs
mounted in the test's own directory (root only; the test is skipped, saying why, elsewhere)."""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

# Bound on every mount and umount call (seconds).
MOUNT_TIMEOUT_S = 10


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """``path`` as a tmpfs of ``size`` bytes (``64k``, ``8m``) while the block runs; unmounted
    after, whatever happened."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs to fill ({exc}): a real full disk needs mount(8) as root")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill ({done.stderr.strip() or done.returncode}): "
                    "a real full disk needs root or CAP_SYS_ADMIN")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=MOUNT_TIMEOUT_S).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=MOUNT_TIMEOUT_S)


def fill(path: Path, chunk: int = 64 * 1024) -> int:
    """Write ``path`` until its file system is full; the bytes written (the ballast)."""
    written = 0
    with path.open("wb", buffering=0) as fh:
        while True:
            try:
                n = fh.write(b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if chunk == 1:
                    return written
                chunk = max(1, chunk // 16)
                continue
            written += n or 0
