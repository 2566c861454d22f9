"""Atomic, step-tagged worker checkpoints.

A checkpoint is everything a worker needs to resume as if it had never
stopped: model and optimizer tensors, RNG states, and what it has already
applied or consumed (deduplicator state, in-flight bookkeeping). It is written
into a temporary directory, fsynced, and renamed into place, so a SIGKILL at any
instant leaves either the previous checkpoint or the new one, never half of one.

This is the anchor of queue-level replay: a worker acks a message only after
the checkpoint that contains its effect is on disk. Whatever it had not yet
checkpointed is still unacked, so the broker delivers it again after a crash,
and the deduplicator restored from the checkpoint discards what was applied.

The digest is a SHA-256 over array names, dtypes, shapes and bytes (not over
the zip container, whose timestamps vary), so two runs that computed the same
state have the same digest: that is how determinism is checked.
"""

from __future__ import annotations

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

from nebula_mq.npyio import load_npz

from nebula_mq.errors import CheckpointError

_STEP_DIR = re.compile(r"^step-(\d{9})$")


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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStore:
    """Checkpoints of one worker under ``root``: ``step-000000042/`` directories."""

    def __init__(self, root: str | os.PathLike[str], keep: int = 3) -> None:
        self.root = Path(root)
        self.keep = max(1, keep)
        self.root.mkdir(parents=True, exist_ok=True)

    def steps(self) -> list[int]:
        found = []
        for entry in self.root.iterdir():
            m = _STEP_DIR.match(entry.name)
            if m and (entry / "meta.json").exists():
                found.append(int(m.group(1)))
        return sorted(found)

    def save(
        self, step: int, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None
    ) -> Checkpoint:
        if step < 0:
            raise CheckpointError(f"checkpoint step must be >= 0, got {step}")
        final = self.root / f"step-{step:09d}"
        tmp = self.root / f".tmp-step-{step:09d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        digest = state_digest(arrays)
        saved_meta = dict(meta or {})
        body = {"step": step, "digest": digest, "meta": saved_meta}
        try:
            with open(tmp / "arrays.npz", "wb") as fh:
                contiguous: dict[str, Any] = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
                np.savez(fh, **contiguous)
                fh.flush()
                os.fsync(fh.fileno())
            with open(tmp / "meta.json", "w") as fh:
                json.dump(body, fh, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
        except (OSError, TypeError, ValueError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"cannot write checkpoint {final}: {exc}") from None
        _fsync_dir(tmp)
        if final.exists():  # re-saving a step (e.g. after resume) replaces it atomically
            old = self.root / f".old-step-{step:09d}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(self.root)
        self._prune()
        return Checkpoint(step, dict(arrays), saved_meta, digest, final)

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
        for entry in self.root.iterdir():
            if entry.name.startswith((".tmp-", ".old-")) and not entry.name.endswith(
                f"-{os.getpid()}"
            ):
                shutil.rmtree(entry, ignore_errors=True)
