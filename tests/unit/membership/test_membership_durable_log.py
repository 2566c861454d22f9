"""The fsynced JSON-lines log under the coordinator's choices and the election's records."""

from __future__ import annotations

from pathlib import Path

import pytest

from nebula_mq.errors import CheckpointError
from nebula_mq.membership import durable_log


def test_records_come_back_in_order_with_their_line_numbers(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    assert durable_log.read(log, "a record") == []
    durable_log.append(log, {"event": 1, "members": [0, 2]})
    durable_log.append(log, {"event": 2, "members": [1]})
    assert durable_log.read(log, "a record") == [(1, {"event": 1, "members": [0, 2]}), (2, {"event": 2, "members": [1]})]


def test_a_line_cut_short_by_a_crash_is_dropped_and_the_next_record_starts_a_line(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    durable_log.append(log, {"event": 1})
    with open(log, "a") as f:
        f.write('{"event": 2, "memb')
    assert durable_log.read(log, "a record") == [(1, {"event": 1})]
    durable_log.append(log, {"event": 3})
    assert durable_log.read(log, "a record") == [(1, {"event": 1}), (2, {"event": 3})]


def test_a_damaged_line_before_the_last_is_refused_with_its_number(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"event": 1}\nnot json\n{"event": 3}\n')
    with pytest.raises(CheckpointError, match="line 2 is not a record"):
        durable_log.read(log, "a record")


def test_a_log_that_cannot_be_written_raises_a_checkpoint_error(tmp_path: Path) -> None:
    # Root may write anywhere, so the failure is a directory where the file should be.
    (tmp_path / "log.jsonl").mkdir()
    with pytest.raises(CheckpointError, match="cannot append a record"):
        durable_log.append(tmp_path / "log.jsonl", {"event": 1})
    with pytest.raises(CheckpointError, match="cannot append a record"):
        durable_log.append(tmp_path / "missing" / "log.jsonl", {"event": 1})


def test_a_record_whose_fsync_fails_is_cut_off_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "log.jsonl"
    durable_log.append(log, {"event": 1})

    def refused(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(durable_log.os, "fsync", refused)
    with pytest.raises(CheckpointError, match="No space left on device"):
        durable_log.append(log, {"event": 2})
    monkeypatch.undo()
    assert durable_log.read(log, "a record") == [(1, {"event": 1})]
