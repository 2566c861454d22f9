"""Append-only, hash-chained audit log: one structlog JSON object per line.

Every record carries ``seq`` (0, 1, 2 ...), ``prev`` (the previous record's
``hash``; 64 zeros for the first) and ``hash`` = SHA-256 of the record's
canonical JSON without ``hash`` (sorted keys, no spaces). Editing, inserting,
removing or reordering any line breaks the chain at that line, which
:func:`verify_chain` reports with its line number. Truncating the *tail* leaves
a valid shorter chain: only a copy of the last hash kept elsewhere (the
``--expect-head`` of ``nebula-mq audit verify``) detects that.

Several processes may append to one log: each append takes an exclusive
``flock`` on the file, reads the last record's hash and writes one line, so
the chain stays linear. Events: ``job_submitted``, ``data_grant``,
``data_revoke``, ``data_access`` / ``data_access_denied``, ``connection_*``,
``cert_issued`` / ``cert_rotated`` / ``cert_revoked``, ``message_rejected``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from nebula_mq.errors import AuditError

GENESIS = "0" * 64
AUDIT_ENV = "NEBULA_AUDIT_LOG"


def default_audit_path() -> Path:
    """``$NEBULA_AUDIT_LOG`` or ``run/audit/audit.jsonl``."""
    return Path(os.environ.get(AUDIT_ENV, "run/audit/audit.jsonl"))
_RESERVED = {"seq", "prev", "hash"}


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), default=str).encode()


def record_hash(record: dict[str, Any]) -> str:
    """The hash a record must carry: SHA-256 of its canonical JSON minus ``hash``."""
    return hashlib.sha256(_canonical({k: v for k, v in record.items() if k != "hash"})).hexdigest()


def _last_line(fd: int) -> bytes:
    """The last non-empty line of an open file (reads backwards in blocks)."""
    size = os.lseek(fd, 0, os.SEEK_END)
    tail = b""
    pos = size
    while pos > 0:
        step = min(4096, pos)
        pos -= step
        tail = os.pread(fd, step, pos) + tail
        stripped = tail.rstrip(b"\n")
        if b"\n" in stripped:
            return stripped.rsplit(b"\n", 1)[1]
    return tail.rstrip(b"\n")


class _ChainedFile:
    """structlog logger: appends each event dict as one chained JSON line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def msg(self, **event: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            last = _last_line(fd)
            if last:
                try:
                    prev = json.loads(last)
                    seq, prev_hash = int(prev["seq"]) + 1, str(prev["hash"])
                except (ValueError, KeyError, TypeError):
                    raise AuditError(f"{self.path}: last line is not an audit record; refusing to append") from None
            else:
                seq, prev_hash = 0, GENESIS
            record = {**event, "seq": seq, "prev": prev_hash}
            record["hash"] = record_hash(record)
            os.write(fd, _canonical(record) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)  # also releases the lock

    info = msg
    warning = msg
    error = msg


def _no_reserved(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    clash = _RESERVED & set(event)
    if clash:
        raise AuditError(f"audit fields {sorted(clash)} are reserved for the chain")
    return event


def _as_kwargs(_logger: Any, _name: str, event: Any) -> tuple[tuple[()], Any]:
    return (), event


class AuditLog:
    """``AuditLog(path).record("job_submitted", job="j1", actor="alice")``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        # An explicit, non-filtering wrapper: the process-wide log level (set by
        # configure_logging) must never drop an audit record.
        self._log = structlog.wrap_logger(
            _ChainedFile(self.path),
            wrapper_class=structlog.BoundLogger,
            context_class=dict,
            processors=[
                _no_reserved,
                structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
                # The logger takes the event dict as keyword arguments (no renderer).
                _as_kwargs,
            ],
        )

    def record(self, event: str, **fields: Any) -> None:
        """Append one record (durable when this returns)."""
        self._log.info(event, **fields)

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record, in order, without verifying the chain."""
        for _n, rec in _parse(self.path):
            yield rec


def _parse(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    except OSError as exc:
        raise AuditError(f"{path}: unreadable ({exc})") from None
    with fh:
        for n, raw in enumerate(fh, start=1):
            if not raw.strip():
                raise AuditError(f"{path}:{n}: empty line inside the log")
            try:
                rec = json.loads(raw)
            except ValueError as exc:
                raise AuditError(f"{path}:{n}: not JSON ({exc})") from None
            if not isinstance(rec, dict):
                raise AuditError(f"{path}:{n}: not a JSON object")
            yield n, rec


@dataclass(frozen=True)
class ChainReport:
    records: int
    # Hash of the last record (GENESIS for an empty log): keep a copy elsewhere to detect truncation.
    head: str


def verify_chain(path: str | os.PathLike[str], expect_head: str | None = None) -> ChainReport:
    """Check every line's hash and link; raises :class:`AuditError` naming the first bad line."""
    path = Path(path)
    prev, count = GENESIS, 0
    for n, rec in _parse(path):
        if rec.get("seq") != count:
            raise AuditError(f"{path}:{n}: seq {rec.get('seq')!r}, expected {count} (line removed or reordered)")
        if rec.get("prev") != prev:
            raise AuditError(f"{path}:{n}: prev does not match line {n - 1}'s hash (chain broken)")
        if rec.get("hash") != record_hash(rec):
            raise AuditError(f"{path}:{n}: hash does not match the record's content (line edited)")
        prev, count = rec["hash"], count + 1
    if expect_head is not None and expect_head != prev:
        raise AuditError(f"{path}: last hash is {prev[:16]}..., expected {expect_head[:16]}... (log truncated?)")
    return ChainReport(count, prev)
