from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nebula_mq.errors import CheckpointError
from nebula_mq.runtime.checkpoint import CheckpointStore, state_digest


def arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((4, 3)).astype(np.float32), "step": np.array([seed])}


def test_save_load_roundtrip_and_latest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    assert store.latest() is None
    for step in (1, 2, 3):
        store.save(step, arrays(step), {"dedupe": {"flow": step}})
    assert store.steps() == [2, 3]  # pruned to keep=2
    ck = store.latest()
    assert ck is not None and ck.step == 3
    np.testing.assert_array_equal(ck.arrays["w"], arrays(3)["w"])
    assert ck.meta == {"dedupe": {"flow": 3}}
    assert ck.digest == state_digest(arrays(3))


def test_digest_depends_on_content_only(tmp_path: Path) -> None:
    a = CheckpointStore(tmp_path / "a").save(5, arrays(7))
    b = CheckpointStore(tmp_path / "b").save(5, arrays(7))
    c = CheckpointStore(tmp_path / "c").save(5, arrays(8))
    assert a.digest == b.digest != c.digest


def test_half_written_checkpoint_is_ignored(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(1, arrays(1))
    # A crash mid-write leaves a temp dir without meta.json: it is not a checkpoint.
    (tmp_path / ".tmp-step-000000002-999999").mkdir()
    (tmp_path / "step-000000002").mkdir()
    assert store.steps() == [1]
    assert store.latest().step == 1  # type: ignore[union-attr]


def test_corruption_is_detected(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    ck = store.save(4, arrays(4))
    assert ck.path is not None
    data = bytearray((ck.path / "arrays.npz").read_bytes())
    data[-200] ^= 0xFF
    (ck.path / "arrays.npz").write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        store.load(4)


def test_resave_same_step_replaces(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(2, arrays(1))
    store.save(2, arrays(2))
    assert store.load(2).digest == state_digest(arrays(2))
