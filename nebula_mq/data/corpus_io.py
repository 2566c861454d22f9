"""JSON-lines corpus files with content digests, and the report of skipped inputs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from nebula_mq.errors import DataError
from nebula_mq.atomic import atomic_writer

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class FileRecord:
    path: str  # relative to the data directory
    sha256: str
    rows: int

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "rows": self.rows}


def sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]], *, root: Path) -> FileRecord:
    """Write rows atomically (temp file + rename); the digest covers the exact bytes."""
    digest = hashlib.sha256()
    count = 0
    with atomic_writer(path) as fh:
        for row in rows:
            line = (json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
            digest.update(line)
            fh.write(line)
            count += 1
    return FileRecord(str(path.relative_to(root)), digest.hexdigest(), count)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    raise DataError(f"{path}:{number}: not a JSON line") from None
    except FileNotFoundError:
        raise DataError(f"{path}: corpus file missing (run `nebula-mq data build`)") from None


@dataclass
class InputReport:
    """What the build read and what it had to skip (mutable: filled while reading)."""

    read: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)

    def skip(self, path: Path | str, why: str) -> None:
        # Every one is in the manifest and counted in the summary; hundreds of empty system
        # catalogues on a line each would bury the rest of the output.
        log.debug("data.input_skipped", path=str(path), why=why)
        self.skipped.append({"path": str(path), "why": why})

    def as_dict(self) -> dict[str, Any]:
        return {"read": self.read, "skipped_count": len(self.skipped), "skipped": self.skipped}
