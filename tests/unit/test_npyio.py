"""numpy files are read from worker threads without building ASTs concurrently.

numpy parses array headers with ``ast.literal_eval``; on CPython 3.11 two threads
building ASTs at once can raise ``SystemError: AST constructor recursion depth
mismatch`` (gh-106905), which once failed CI inside a worker thread restoring a
checkpoint. The race itself is rare, so the test widens the window: it makes the
header parse slow and counts how many threads are inside it at once.
"""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from nebula_mq.data.batches import load_arrays
from nebula_mq.runtime.checkpoint import CheckpointStore


@pytest.fixture
def max_concurrent_header_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    inside, peak, lock = [0], [0], threading.Lock()
    real = ast.literal_eval

    def slow_literal_eval(node_or_string: object) -> object:
        with lock:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        try:
            time.sleep(0.002)  # a thread switch here is what the real race needs
            return real(node_or_string)  # type: ignore[arg-type]
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(ast, "literal_eval", slow_literal_eval)
    return peak


def _in_threads(fn: object, n: int = 4) -> None:
    errors: list[BaseException] = []

    def go() -> None:
        try:
            for _ in range(3):
                fn()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=go, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and not any(t.is_alive() for t in threads)


def test_checkpoints_restored_from_several_threads_parse_one_header_at_a_time(
        tmp_path: Path, max_concurrent_header_parses: list[int]) -> None:
    stores = [CheckpointStore(tmp_path / f"w{i}") for i in range(4)]
    for store in stores:
        store.save(1, {f"p{k}": np.arange(k + 1, dtype=np.float32) for k in range(8)}, {})
    loads = iter(stores * 3)
    lock = threading.Lock()

    def load() -> None:
        with lock:
            store = next(loads)
        assert store.load(1).arrays["p7"].shape == (8,)

    _in_threads(load)
    assert max_concurrent_header_parses[0] == 1


def test_tokenized_splits_loaded_from_several_threads_parse_one_header_at_a_time(
        tmp_path: Path, max_concurrent_header_parses: list[int]) -> None:
    path = tmp_path / "train.npz"
    np.savez(path, index=np.arange(4), src_ids=np.ones((4, 3), np.int32), tgt_ids=np.ones((4, 5), np.int32))
    _in_threads(lambda: load_arrays(path))
    assert max_concurrent_header_parses[0] == 1
