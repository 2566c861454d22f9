"""Atomic file writes: a reader sees the old file or the new one, never a half-written one.

Every file another process may read while it changes (status, metrics, stack and
relay control files, manifests, keys, evaluation results) is written through here:
a temporary file beside the target, with its final permissions from the first
byte, then ``os.replace``. A write that fails (a full disk included) removes its
temporary file, so a failed write never holds the space it took. Checkpoints are
directories and have their own rename protocol (``nebula_mq.runtime.checkpoint``).

A full disk (``ENOSPC``), an exceeded quota (``EDQUOT``) or a read-only file system
(``EROFS``) is :func:`disk_full`; :class:`SkipWhenFull` runs the writes that are not a
source of truth (metrics, status, tensorboard, progress lines) so that such a disk skips
them, with one warning per episode, instead of stopping the worker.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")

# The errors of a disk that takes no more bytes: full, over quota, or mounted read-only.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


@contextlib.contextmanager
def atomic_writer(path: Path, *, mode: int = 0o644, fsync: bool = False, replace: bool = True
                  ) -> Iterator[IO[bytes]]:
    """A binary file handle whose content replaces ``path`` when the block ends without error.

    ``mode`` applies from creation (a private key is never readable by others, even
    briefly); ``fsync`` makes the content durable before the rename. ``replace=False``: the
    content takes ``path`` only if nothing is there yet (``os.link``, atomic: of two processes
    making the same secret at once, one wins and the other's is dropped: ``FileExistsError``)."""
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
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.unlink(tmp)
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


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk takes no more bytes (:data:`DISK_FULL_ERRNOS`)."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def disk_problem(exc: OSError) -> str:
    """``exc`` in a few words: "no space left on device", "disk quota exceeded"..."""
    text = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
    return text[:1].lower() + text[1:]


class SkipWhenFull:
    """Runs a write that is not a source of truth. On a full disk (:func:`disk_full`) the write
    is skipped and ``warn(what, error)`` is called once, until a write succeeds again; any
    other error is raised."""

    def __init__(self, what: str, warn: Callable[[str, str], None]) -> None:
        self.what, self.warn = what, warn
        self.skipping = False  # the last write was skipped: the next skip is not reported

    def __call__(self, write: Callable[[], T]) -> T | None:
        try:
            out = write()
        except OSError as exc:
            if not disk_full(exc):
                raise
            if not self.skipping:
                self.warn(self.what, disk_problem(exc))
            self.skipping = True
            return None
        self.skipping = False
        return out
