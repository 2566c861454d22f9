"""An audit log on a full filesystem: a typed error naming the log and the cause, never a dropped
record nor a part line; the chain goes on once there is room. A real full disk: a 64 KiB tmpfs
(needs root, else skipped)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nebula_mq.errors import AuditError
from nebula_mq.security.audit import AuditLog, verify_chain


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True, timeout=30, check=True)


def test_a_full_disk_is_an_audit_error_and_loses_nothing_written(small_disk: Path) -> None:
    path = small_disk / "audit" / "audit.jsonl"
    log = AuditLog(path)
    log.record("job_submitted", job="j1")
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (32 << 10))
    written = 1
    with pytest.raises(AuditError) as full:
        for _ in range(200):  # bounded: 64 KiB takes far fewer records of 1 KiB
            log.record("message_dead_lettered", message_id=f"m{written}", detail="x" * 1000)
            written += 1
    assert str(path) in str(full.value) and "no space left on device" in str(full.value)
    assert written > 1
    # What was written is whole: no part line, the chain verifies, nothing acknowledged is missing.
    assert verify_chain(path).records == written
    assert path.read_bytes().endswith(b"\n")
    # Room again: the next record continues the same chain.
    filler.unlink()
    log.record("message_dead_lettered", message_id="after", detail="")
    assert verify_chain(path).records == written + 1


def test_an_unwritable_directory_is_an_audit_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(AuditError, match="cannot write the audit log"):
        AuditLog(blocker / "audit.jsonl").record("job_submitted", job="j1")
    assert os.path.isfile(blocker)
