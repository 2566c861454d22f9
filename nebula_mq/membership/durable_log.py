"""Append-only logs of JSON lines, each durable before anyone is told of it: what a cluster
decided, beside its checkpoints (the coordinator's choices, ``quorum.jsonl``; ``election.jsonl``)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nebula_mq.errors import CheckpointError
from nebula_mq.runtime.checkpoint import fsync_dir


def append(path: Path, record: Mapping[str, Any]) -> None:
    """Append ``record`` as one line, fsynced, and the directory entry too when the file is new.
    A disk that refuses the write (full, read-only, gone) raises CheckpointError, with the line
    cut off again where it can be: the caller stops before anyone is told, and a restart must not
    find a record that nobody acted on."""
    new, end = not path.exists(), None
    try:
        with open(path, "a", encoding="utf-8") as f:
            end = f.tell()
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if new:
            fsync_dir(path.parent)
    except OSError as e:
        if end is not None:
            with contextlib.suppress(OSError):  # the disk refuses this too: read() drops a last line cut short
                os.truncate(path, end)
        raise CheckpointError(f"{path}: cannot append a record: {e.strerror or e}") from None


def read(path: Path, what: str) -> list[tuple[int, Any]]:
    """The records of a log with their line numbers. A last line cut short by a crash was never
    acted on: it is cut off the file here, so the next record starts a line of its own. Any
    other line that is not JSON raises CheckpointError (``what``: what a line should be)."""
    if not path.exists():
        return []
    text = path.read_bytes()
    if text and not text.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(text.rfind(b"\n") + 1)
            os.fsync(f.fileno())
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            records.append((number, json.loads(line)))
        except ValueError:
            raise CheckpointError(f"{path}: line {number} is not {what}") from None
    return records
