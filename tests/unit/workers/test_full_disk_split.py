"""The worked split example (examples/split_mlp) with its run directory on a real file system that
fills up mid-run (a tmpfs, filled with a ballast file at step 12): both workers stop with one
``CheckpointError`` at the next checkpoint, the last good checkpoints (step 10) are intact, nothing
after them was acked, the history still reads; once the ballast is gone, the same job resumes
from the queues and ends bit-identical to a clean run."""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from nebula_mq.errors import CheckpointError
from nebula_mq.report.parse import read_history
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.hooks import Hook
from nebula_mq.settings import Settings
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import SPLIT_EXAMPLE, drivers, memory_worker, run_split_pair, split_settings
from tests.unit.runtime.full_disk import fill, tmpfs

pytestmark = pytest.mark.paddle

STEPS, FULL_AT, LAST_GOOD = 20, 12, 10  # checkpoints every 5 steps: the one at 15 meets a full disk
WORKERS = ("head-0", "tail-0")
JOIN_S = 60.0  # bound on each run of the pair


class Ballast(Hook):
    """Fills the file system at ``step``: the head is there only once the tail applied it, so
    both hold their checkpoint at LAST_GOOD and neither has reached the next."""

    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step = path, step

    def on_step(self, step: int, values: Mapping[str, float]) -> None:
        if step == self.step:
            fill(self.path)


def run_until_failure(settings: Settings, broker: MemoryBroker, ballast: Path) -> dict[str, BaseException]:
    """Run the pair, the ballast hooked to the head; when one worker fails the other is asked
    to stop (as a launcher would), so it meets the full disk at its last checkpoint instead of
    waiting for a peer that is gone. The broker stays up. Returns each worker's error."""
    if str(SPLIT_EXAMPLE) not in sys.path:
        sys.path.insert(0, str(SPLIT_EXAMPLE))
    import mlp  # type: ignore[import-not-found]

    from workers.split.head import SpecHead
    from workers.split.tail import SpecTail

    tail = SpecTail(settings, mlp.build_tail(settings), memory_worker(SpecTail.identity(settings), broker))
    head = SpecHead(settings, mlp.build_head(settings), memory_worker(SpecHead.identity(settings), broker))
    head.worker.hooks.add(Ballast(ballast, FULL_AT))
    units = drivers(tail, head)
    errors: dict[str, BaseException] = {}

    def go(unit: Any) -> None:
        try:
            unit.main()
        except BaseException as exc:  # noqa: BLE001 - returned
            errors[unit.worker_id] = exc
            for other in units:
                other.worker.stop_requested.set()

    threads = [threading.Thread(target=go, args=(u,), daemon=True) for u in units]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    if any(t.is_alive() for t in threads):
        broker.shutdown("the test's bound ran out")
        pytest.fail(f"the pair did not stop within {JOIN_S} s on a full disk")
    return errors


def queued(broker: MemoryBroker) -> dict[str, list[int]]:
    """The micro-batches (message ids' last field) ready in each queue that holds any."""
    with broker.cond:
        return {name: sorted(int(m.message_id.rsplit("/", 1)[1]) for m in q.ready)
                for name, q in broker.queues.items() if q.ready}


def test_a_full_disk_stops_the_pair_cleanly_and_the_job_resumes_bit_identical(tmp_path: Path) -> None:
    clean = split_settings(tmp_path / "clean", steps=STEPS)
    run_split_pair(clean, MemoryBroker())
    with tmpfs(tmp_path / "full", "2m") as run_dir:
        settings = split_settings(run_dir, steps=STEPS)
        broker, ballast = MemoryBroker(), run_dir / "ballast"
        errors = run_until_failure(settings, broker, ballast)

        assert sorted(errors) == sorted(WORKERS), errors
        for worker, error in errors.items():
            root = run_dir / "checkpoints" / worker
            assert isinstance(error, CheckpointError), repr(error)
            assert str(error).endswith(
                f"of {worker}: no space left on device in {root} (the last good checkpoint, step {LAST_GOOD}, "
                "is intact; free space and run the same command to resume)"), str(error)
            assert error.__cause__ is None and error.__suppress_context__  # one line, no library traceback
            good = CheckpointStore(root).latest()
            expected = CheckpointStore(tmp_path / "clean" / "checkpoints" / worker).load(LAST_GOOD)
            assert good is not None and (good.step, good.digest) == (LAST_GOOD, expected.digest)
            assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no temporary holds space
        # Nothing after the last good checkpoints was acked: from micro-batch LAST_GOOD (step
        # LAST_GOOD + 1) on, every activation and every gradient is still queued.
        for name, batches in queued(broker).items():
            if "dead-letter" not in name:
                assert batches[0] == LAST_GOOD and batches == list(range(LAST_GOOD, batches[-1] + 1)), (name, batches)
        # The history rows written before the failed checkpoint read whole.
        for worker in WORKERS:
            path = run_dir / "history" / f"{worker}.jsonl"
            rows, skipped = read_history(path.read_text(), str(path))
            assert not skipped and rows[0]["step"] == 1

        ballast.unlink()
        run_split_pair(settings, broker)  # the same job, the same broker: it resumes from the queues

        for worker in WORKERS:
            a = CheckpointStore(tmp_path / "clean" / "checkpoints" / worker).latest()
            c = CheckpointStore(run_dir / "checkpoints" / worker).latest()
            assert a is not None and c is not None and (c.step, c.digest) == (STEPS, a.digest)
            path, clean_path = run_dir / "history" / f"{worker}.jsonl", tmp_path / "clean" / "history" / f"{worker}.jsonl"
            rows, skipped = read_history(path.read_text(), str(path))
            clean_rows, _ = read_history(clean_path.read_text(), str(clean_path))
            assert not skipped and [r["step"] for r in rows] == [float(s) for s in range(1, STEPS + 1)]
            assert [r["loss"] for r in rows] == [r["loss"] for r in clean_rows]
