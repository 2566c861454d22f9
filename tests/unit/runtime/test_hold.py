"""The step hold a chaos run puts on its workers (``nebula_mq.runtime.hold``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from nebula_mq.runtime.hold import StepHold, read_hold, set_hold

# A wait that should end ends within this on a loaded machine too; one that should not end
# (the hold still in place) never would, so the bound tells the two apart without a schedule.
ENDS_S = 10.0


def test_a_worker_waits_at_the_hold_until_it_moves_on(tmp_path: Path) -> None:
    path = tmp_path / "step-hold"
    set_hold(path, 5)
    hold = StepHold(path)
    t0 = time.monotonic()
    hold.wait(4, lambda: False)  # below the hold: passes at once
    assert time.monotonic() - t0 < ENDS_S
    passed = threading.Event()
    waiter = threading.Thread(target=lambda: (hold.wait(5, lambda: False), passed.set()), daemon=True)
    waiter.start()
    assert not passed.wait(0.3)  # at the hold: waits
    set_hold(path, 9)
    assert passed.wait(ENDS_S)
    waiter.join(ENDS_S)


def test_lifting_the_hold_or_a_stop_releases_a_waiting_worker(tmp_path: Path) -> None:
    path = tmp_path / "step-hold"
    set_hold(path, 3)
    hold = StepHold(path)
    stop = threading.Event()
    released = threading.Event()
    waiter = threading.Thread(target=lambda: (hold.wait(7, stop.is_set), released.set()), daemon=True)
    waiter.start()
    assert not released.wait(0.3)
    stop.set()  # a stop request ends the wait, hold or not
    assert released.wait(ENDS_S)
    set_hold(path, None)
    assert not path.exists() and read_hold(path) is None
    t0 = time.monotonic()
    hold.wait(100, lambda: False)  # no hold: no wait
    assert time.monotonic() - t0 < ENDS_S


def test_no_variable_no_file_or_garbage_is_no_hold(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("NEBULA_STEP_HOLD_FILE", raising=False)
    assert StepHold.from_environment().path is None
    path = tmp_path / "step-hold"
    path.write_text("not a step\n")
    assert read_hold(path) is None
    monkeypatch.setenv("NEBULA_STEP_HOLD_FILE", str(path))
    hold = StepHold.from_environment()
    assert hold.path == path
    t0 = time.monotonic()
    hold.wait(10**6, lambda: False)
    assert time.monotonic() - t0 < ENDS_S
