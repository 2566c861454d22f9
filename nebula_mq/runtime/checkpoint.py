"""Atomic, step-tagged worker checkpoints.

A checkpoint is everything a worker needs to resume as if it had never
stopped: model and optimizer tensors, RNG states, and what it has already
applied or consumed (its step, which restores each stream's counter). It is written
into a temporary directory, fsynced, and renamed into place, so a SIGKILL at any
instant leaves either the previous checkpoint or the new one, never half of one.

This is the anchor of queue-level replay: a worker acks a message only after
the checkpoint that contains its effect is on disk. Whatever it had not yet
checkpointed is still unacked, so the broker delivers it again after a crash,
and the counters restored from the checkpoint's step discard what was applied.

The digest is a SHA-256 over array names, dtypes, shapes and bytes (not over
the zip container, whose timestamps vary), so two runs that computed the same
state have the same digest: that is how determinism is checked.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nebula_mq.atomic import disk_problem
from nebula_mq.errors import CheckpointError
from nebula_mq.npyio import load_npz

_STEP_DIR = re.compile(r"^step-(\d{9})$")
_OLD_DIR = re.compile(r"^\.old-(step-\d{9})-\d+$")  # a step's copy while it is saved again
# What the user does about a disk that takes no more bytes, by errno (others: "fix it").
_FIX = {errno.ENOSPC: "free space", errno.EDQUOT: "free space or raise the quota",
        errno.EROFS: "make it writable"}


@dataclass(frozen=True)
class Checkpoint:
    step: int
    arrays: Mapping[str, np.ndarray]
    # JSON-able state: RNG states, counters (e.g. the next micro-batch to send).
    meta: Mapping[str, Any] = field(default_factory=dict)
    digest: str = ""
    path: Path | None = None


def state_digest(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a directory's entries durable (a file created or renamed in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    """Checkpoints of one worker under ``root``: ``step-000000042/`` directories. ``name``
    (default: the directory's name, the worker's id) names the owner in errors."""

    def __init__(self, root: str | os.PathLike[str], keep: int = 3, name: str | None = None) -> None:
        self.root = Path(root)
        self.keep = max(1, keep)
        self.name = name or self.root.name
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create the checkpoint directory {self.root}: "
                                  f"{disk_problem(exc)}") from None

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints: a step directory appears only by a rename
        once its ``meta.json`` is written, so a failed or killed save is never listed."""
        found = []
        for entry in self.root.iterdir():
            m = _STEP_DIR.match(entry.name)
            if m and (entry / "meta.json").exists():
                found.append(int(m.group(1)))
        return sorted(found)

    def save(
        self, step: int, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None
    ) -> Checkpoint:
        """Write checkpoint ``step``. On any failure (a full disk included) the previous
        checkpoints are untouched, nothing of this one is left behind, and a
        :class:`CheckpointError` says what failed and which checkpoint a restart resumes from."""
        if step < 0:
            raise CheckpointError(f"checkpoint step must be >= 0, got {step}")
        final = self.root / f"step-{step:09d}"
        tmp = self.root / f".tmp-step-{step:09d}-{os.getpid()}"
        digest = state_digest(arrays)
        saved_meta = dict(meta or {})
        body = {"step": step, "digest": digest, "meta": saved_meta}
        try:
            self._sweep(mine=True)  # what a killed or failed save left frees its space first
            tmp.mkdir()
            with open(tmp / "arrays.npz", "wb") as fh:
                contiguous: dict[str, Any] = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
                np.savez(fh, **contiguous)
                fh.flush()
                os.fsync(fh.fileno())
            with open(tmp / "meta.json", "w") as fh:
                json.dump(body, fh, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            fsync_dir(tmp)
            self._rename(tmp, final, step)
            fsync_dir(self.root)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(self._failed(step, exc)) from None
        except (TypeError, ValueError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"cannot write checkpoint {final}: {exc}") from None
        self._prune()
        return Checkpoint(step, dict(arrays), saved_meta, digest, final)

    def _rename(self, tmp: Path, final: Path, step: int) -> None:
        """Put ``tmp`` in place as ``final``; a step saved again (after a resume) is replaced
        atomically, and restored when the replacement fails."""
        if not final.exists():
            os.replace(tmp, final)
            return
        old = self.root / f".old-step-{step:09d}-{os.getpid()}"
        os.replace(final, old)
        try:
            os.replace(tmp, final)
        except OSError:
            os.replace(old, final)
            raise
        shutil.rmtree(old, ignore_errors=True)

    def _failed(self, step: int, exc: OSError) -> str:
        """What a failed save of ``step`` tells the user: what failed, where, and what is safe."""
        try:
            good = self.steps()  # a failed save adds none, and a step saved again keeps its old one
        except OSError:
            good = None
        kept = ("the earlier checkpoints are as they were" if good is None
                else f"the last good checkpoint, step {good[-1]}, is intact" if good
                else "no earlier checkpoint was written")
        fix = _FIX.get(exc.errno or 0, "fix it")
        return (f"checkpoint step {step} of {self.name}: {disk_problem(exc)} in {self.root} "
                f"({kept}; {fix} and run the same command to resume)")

    def load(self, step: int) -> Checkpoint:
        path = self.root / f"step-{step:09d}"
        try:
            with open(path / "meta.json") as fh:
                body = json.load(fh)
            arrays = load_npz(path / "arrays.npz")
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from None
        digest = state_digest(arrays)
        if digest != body.get("digest"):
            raise CheckpointError(f"checkpoint {path} is corrupt: digest mismatch")
        return Checkpoint(int(body["step"]), arrays, body.get("meta", {}), digest, path)

    def latest(self) -> Checkpoint | None:
        steps = self.steps()
        return self.load(steps[-1]) if steps else None

    def _prune(self) -> None:
        for step in self.steps()[: -self.keep]:
            shutil.rmtree(self.root / f"step-{step:09d}", ignore_errors=True)
        self._sweep(mine=False)

    def _sweep(self, mine: bool) -> None:
        """Remove the temporary directories of other processes' saves (killed mid-save), and this
        process's own too when ``mine``. A step's replaced copy (``.old-``) whose replacement
        never arrived is put back instead."""
        for entry in self.root.iterdir():
            if not entry.name.startswith((".tmp-", ".old-")) or (
                    not mine and entry.name.endswith(f"-{os.getpid()}")):
                continue
            replaced = _OLD_DIR.match(entry.name)
            if replaced and not (self.root / replaced.group(1)).exists():
                os.replace(entry, self.root / replaced.group(1))
            else:
                shutil.rmtree(entry, ignore_errors=True)
