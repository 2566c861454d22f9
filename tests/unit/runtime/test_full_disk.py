"""A full disk under a worker, on a real full file system (a tmpfs filled with a ballast file):
atomic writes leave no temporary file, a failed checkpoint leaves the last good one intact and
says so in one ``CheckpointError``, and the reports (status, history, metrics, tensorboard,
progress lines) skip their writes with one warning instead of stopping the worker."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from nebula_mq.atomic import SkipWhenFull, disk_full, write_atomic
from nebula_mq.errors import CheckpointError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.metrics import MetricsHook
from nebula_mq.runtime.progress import Progress
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.channels import make
from tests.unit.runtime.full_disk import MOUNT_TIMEOUT_S, fill, tmpfs

ARRAYS: dict[str, np.ndarray] = {"w": np.arange(4096, dtype=np.float32), "b": np.ones(3, dtype=np.float64)}


def skips(logs: Sequence[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "write_skipped"]


def test_disk_full_errors_and_skip_warns_once_per_episode() -> None:
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        assert disk_full(OSError(code, os.strerror(code)))
    assert not disk_full(OSError(errno.EACCES, "denied")) and not disk_full(ValueError("x"))
    warned: list[tuple[str, str]] = []
    skip = SkipWhenFull("status", lambda what, problem: warned.append((what, problem)))

    def full() -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert skip(full) is None and skip(full) is None
    assert warned == [("status", "no space left on device")]  # once, however many skips
    assert skip(lambda: 7) == 7
    skip(full)
    assert len(warned) == 2  # a new episode after a write that worked
    with pytest.raises(PermissionError):
        skip(lambda: (_ for _ in ()).throw(PermissionError(errno.EACCES, "denied")))


def test_atomic_write_on_a_full_disk_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "64k") as fs:
        target = fs / "status.json"
        write_atomic(target, "old")
        fill(fs / "ballast")
        with pytest.raises(OSError) as raised:
            write_atomic(target, "x" * 32768)
        assert disk_full(raised.value)
        assert target.read_text() == "old"
        assert sorted(p.name for p in fs.iterdir()) == ["ballast", "status.json"]


def test_checkpoint_on_a_full_disk_keeps_the_last_good_one(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "256k") as fs:
        store = CheckpointStore(fs / "checkpoints" / "tail-0")
        good = store.save(30, ARRAYS, {"next": 31})
        ballast = fs / "ballast"
        fill(ballast)
        for step in (40, 30):  # a new step, and a step saved again (after a resume)
            with pytest.raises(CheckpointError) as raised:
                store.save(step, ARRAYS, {"next": step + 1})
            assert str(raised.value) == (
                f"checkpoint step {step} of tail-0: no space left on device in {store.root} (the last good "
                "checkpoint, step 30, is intact; free space and run the same command to resume)")
            assert raised.value.__cause__ is None and raised.value.__suppress_context__
        latest = CheckpointStore(store.root).latest()
        assert latest is not None and (latest.step, latest.digest, latest.meta) == (30, good.digest, {"next": 31})
        assert sorted(p.name for p in store.root.iterdir()) == ["step-000000030"]  # no temporary holds space
        ballast.unlink()
        assert store.save(40, ARRAYS, {"next": 41}).step == 40
        assert store.steps() == [30, 40]


def test_checkpoint_on_a_read_only_disk_says_so(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "256k") as fs:
        store = CheckpointStore(fs / "ck")
        store.save(5, ARRAYS)
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True, timeout=MOUNT_TIMEOUT_S)
        with pytest.raises(CheckpointError, match=r"checkpoint step 10 of ck: read-only file system in .* \(the "
                           r"last good checkpoint, step 5, is intact; make it writable and run the same"):
            store.save(10, ARRAYS)
        assert store.latest().step == 5  # type: ignore[union-attr]


def test_metrics_textfile_skips_on_a_full_disk(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "64k") as fs:
        hook = MetricsHook("tail", fs / "metrics" / "tail-0.prom")
        hook.on_step(1, {"loss": 1.0})
        ballast = fs / "ballast"
        fill(ballast)
        with capture_logs() as logs:
            for step in range(2, 6):
                hook.on_step(step, {"loss": 1.0 / step})
        assert [(e["what"], e["error"]) for e in skips(logs)] == [("metrics", "no space left on device")]
        assert sorted(p.name for p in (fs / "metrics").iterdir()) == ["tail-0.prom"]
        ballast.unlink()
        hook.on_step(6, {"loss": 0.1})
        assert "nebula_step{" in (fs / "metrics" / "tail-0.prom").read_text()
        assert "} 6.0" in (fs / "metrics" / "tail-0.prom").read_text()


def test_tensorboard_skips_on_a_full_disk_without_blocking(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    from nebula_mq.runtime.tracking import TensorBoardHook

    with tmpfs(tmp_path / "fs", "64k") as fs:
        fill(fs / "ballast")
        hook = TensorBoardHook(fs / "tb")
        failed: list[BaseException] = []

        def steps() -> None:  # more events than tensorboardX's queue holds (10)
            try:
                for step in range(1, 60):
                    hook.on_step(step, {"loss": 1.0 / step, "lr": 0.1})
                hook.close()
            except BaseException as exc:  # noqa: BLE001 - reported below
                failed.append(exc)
        with capture_logs() as logs:
            runner = threading.Thread(target=steps, daemon=True)
            runner.start()
            runner.join(30)
        assert not runner.is_alive(), "the tensorboard hook blocked on a full disk"
        assert not failed
        assert {e["what"] for e in skips(logs)} == {"tensorboard"}


def test_progress_line_skips_on_a_full_disk(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "64k") as fs:
        fill(fs / "ballast")
        out = (fs / "progress.log").open("w", buffering=1)  # line-buffered, as stderr
        bar = Progress(10, None, desc="train", stream=out, every_s=0.0)
        with capture_logs() as logs:
            for _ in range(3):
                bar.update()
        with contextlib.suppress(OSError):  # its buffer still holds the lines it could not write
            out.close()
        assert bar.n == 3 and [e["what"] for e in skips(logs)] == ["progress"]


def test_worker_reports_skip_and_history_is_never_torn(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "128k") as fs:
        worker = make(fs, MemoryBroker(), "t", "tail-0")
        worker.step = 1
        worker.record_step({"loss": 1.0})
        worker.write_history()
        history = fs / "history" / "tail-0.jsonl"
        before = history.read_bytes()
        ballast = fs / "ballast"
        fill(ballast)
        with capture_logs() as logs:
            for step in range(2, 120):  # more rows than the file's last page holds
                worker.step = step
                worker.record_step({"loss": 1.0 / step, "padding": 1e-300 * step})
            worker.write_history()
            worker.status("stopped")
        assert history.read_bytes() == before  # cut back: no torn row for the next append
        skipped = [e["what"] for e in skips(logs)]
        assert {"history", "metrics", "status"} <= set(skipped) and len(skipped) == len(set(skipped))  # once each
        ballast.unlink()
        worker.write_history()  # the rows kept meanwhile
        rows = history.read_text().splitlines()
        assert len(rows) == 119 and all(r.endswith("}") for r in rows)
        worker.hooks.close()


def test_a_save_puts_back_a_step_whose_replacement_never_arrived(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck")
    good = store.save(5, ARRAYS)
    (store.root / "step-000000005").rename(store.root / ".old-step-000000005-999999")  # killed mid-replace
    (store.root / ".tmp-step-000000010-999999").mkdir()  # killed mid-save: holds space
    store.save(10, ARRAYS)
    assert sorted(p.name for p in store.root.iterdir()) == ["step-000000005", "step-000000010"]
    assert store.load(5).digest == good.digest
