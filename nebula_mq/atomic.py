"""Atomic file writes: a reader sees the old file or the new one, never a half-written one.

Every file another process may read while it changes (status, metrics, stack and
relay control files, manifests, keys, evaluation results) is written through here:
a temporary file beside the target, with its final permissions from the first
byte, then ``os.replace``. Checkpoints are directories and have their own rename
protocol (``nebula_mq.runtime.checkpoint``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_writer(path: Path, *, mode: int = 0o644, fsync: bool = False) -> Iterator[IO[bytes]]:
    """A binary file handle whose content replaces ``path`` when the block ends without error.

    ``mode`` applies from creation (a private key is never readable by others, even
    briefly); ``fsync`` makes the content durable before the rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Unique per process and thread: two writers never share a temporary file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # os.open's mode was narrowed by the umask
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o644, fsync: bool = False) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8)."""
    with atomic_writer(path, mode=mode, fsync=fsync) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_json_atomic(path: Path, body: Any, **dumps: Any) -> None:
    """Replace ``path`` with ``body`` as JSON (``dumps`` go to ``json.dumps``)."""
    write_atomic(path, json.dumps(body, **dumps))
