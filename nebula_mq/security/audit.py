"""Append-only, hash-chained audit log: one JSON object per line.

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
``cert_issued`` / ``cert_rotated`` / ``cert_revoked``, ``message_rejected``,
``message_dead_lettered``, ``dead_letter_unvouched``.

A record that cannot be written (a full disk, a read-only or missing directory) is an
:class:`AuditError` naming the log and the cause ("no space left on device"), never a record
dropped: a partly written line is cut off again, so the chain stays valid and the next append,
once there is room, continues it. A worker stops on it (an unaudited security event is a
security failure).
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def _append_chained(path: Path, event: dict[str, Any]) -> None:
    """Append ``event`` to the log at ``path`` as one chained JSON line (under the file's lock)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o640)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        last = _last_line(fd)
        if last:
            try:
                prev = json.loads(last)
                seq, prev_hash = int(prev["seq"]) + 1, str(prev["hash"])
            except (ValueError, KeyError, TypeError):
                raise AuditError(f"{path}: last line is not an audit record; refusing to append") from None
        else:
            seq, prev_hash = 0, GENESIS
        record = {**event, "seq": seq, "prev": prev_hash}
        record["hash"] = record_hash(record)
        _append(path, fd, _canonical(record) + b"\n")
    finally:
        os.close(fd)  # also releases the lock


def _unwritable(path: Path, exc: OSError) -> AuditError:
    cause = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    return AuditError(f"{path}: cannot write the audit log: {cause}; the record was not written")


def _append(path: Path, fd: int, line: bytes) -> None:
    """Write and fsync ``line`` whole (the caller holds the lock), or cut the file back to where
    it was and raise :class:`AuditError`: a full disk can take part of a line, and a part line
    would end the chain."""
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        done = 0
        while done < len(line):
            n = os.write(fd, line[done:])
            if n == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            done += n
        os.fsync(fd)
    except OSError as exc:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass  # the error below names the cause; a part line fails verify_chain at that line
        raise _unwritable(path, exc) from None


class AuditLog:
    """``AuditLog(path).record("job_submitted", job="j1", actor="alice")``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def record(self, event: str, **fields: Any) -> None:
        """Append one record, stamped ``ts`` (ISO 8601, UTC); durable when this returns. No
        logging configuration is involved: a process-wide log level never drops a record."""
        clash = _RESERVED & set(fields)
        if clash:
            raise AuditError(f"audit fields {sorted(clash)} are reserved for the chain")
        ts = dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")
        _append_chained(self.path, {**fields, "event": event, "ts": ts})

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
