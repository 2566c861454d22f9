"""One helper for atomic file writes (nebula_mq.atomic)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest

from nebula_mq.atomic import atomic_writer, write_atomic, write_json_atomic


def test_the_file_is_replaced_whole_with_its_mode_and_no_temporary_is_left(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "key.pem"
    write_atomic(path, b"secret", mode=0o600, fsync=True)
    assert path.read_bytes() == b"secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_json_atomic(path, {"a": 1}, sort_keys=True)
    assert json.loads(path.read_text()) == {"a": 1}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["key.pem"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_writer(path) as fh:
            fh.write(b"half of the new")
            raise RuntimeError("disk full")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_numpy_writes_through_the_handle(tmp_path: Path) -> None:
    path = tmp_path / "train.npz"
    with atomic_writer(path) as fh:
        np.savez_compressed(fh, x=np.arange(3))
    np.testing.assert_array_equal(np.load(path)["x"], np.arange(3))
