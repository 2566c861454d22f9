"""A transport's broker alarm (``transport.alarm``): what blocked connections add up to, the
patience clock that stands still meanwhile, the stop that ends a wait, and the worker's status."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from pathlib import Path

import pytest

from nebula_mq.errors import StopDuringAlarm, TransportError
from nebula_mq.runtime.reporter import Reporter, status_dir
from nebula_mq.settings import JobSettings, Settings
from nebula_mq.transport.alarm import BrokerAlarm
from nebula_mq.transport.publisher import InterruptibleHandle, PublishWindow
from nebula_mq.transport.retry import Patience, PublishStats


def test_the_alarm_is_on_from_the_first_blocked_connection_to_the_last_unblocked() -> None:
    alarm = BrokerAlarm("cluster-b")
    told: list[str | None] = []
    alarm.subscribe(told.append)
    alarm.blocked("pub-1", "low on memory")
    alarm.blocked("pub-2", "low on memory")
    assert alarm.active and alarm.reason == "low on memory" and alarm.blocks("pub-2")
    alarm.unblocked("pub-1")
    assert alarm.active, "pub-2 is still blocked"
    alarm.unblocked("pub-2")
    alarm.unblocked("pub-2")  # a connection that closes after its unblock: nothing more
    assert not alarm.active and not alarm.blocks("pub-2")
    assert told == ["low on memory", None], "told once on, once off"


def test_a_listener_that_fails_does_not_break_the_alarm() -> None:
    alarm = BrokerAlarm("cluster-b")

    def broken(_reason: str | None) -> None:
        raise RuntimeError("boom")

    alarm.subscribe(broken)
    alarm.blocked("pub-1", "low on disk")
    assert alarm.active


def test_the_patience_clock_stands_still_while_blocked() -> None:
    alarm = BrokerAlarm("cluster-b")
    patience = Patience("q", "m", 0.3, PublishStats(), alarm.clock)
    alarm.blocked("pub-1", "low on memory")
    time.sleep(0.5)  # longer than the patience, all of it blocked
    assert patience.next_wait(TransportError("x")) is not None, "time blocked is not counted"
    alarm.unblocked("pub-1")
    time.sleep(0.35)
    assert patience.next_wait(TransportError("x")) is None, "time unblocked is"


def test_a_stop_ends_a_wait_only_while_the_broker_blocks() -> None:
    stop = False
    alarm = BrokerAlarm("cluster-b")
    alarm.stop_when(lambda: stop)
    future: concurrent.futures.Future[None] = concurrent.futures.Future()
    handle = InterruptibleHandle(future, "m", alarm.check_stop)
    stop = True
    with pytest.raises(TransportError, match="no confirm within"):
        handle.wait(0.2)  # a stop without an alarm: the wait is the ordinary one (a checkpoint needs it)
    alarm.blocked("pub-1", "low on memory")
    with pytest.raises(StopDuringAlarm, match="cluster-b"):
        handle.wait()
    future.set_result(None)
    handle.wait()  # confirmed: nothing to abandon


def test_a_stop_during_an_alarm_ends_a_wait_for_room_in_the_window() -> None:
    alarm = BrokerAlarm("cluster-b")
    stop = threading.Event()
    alarm.stop_when(stop.is_set)
    window: PublishWindow[str] = PublishWindow(1, 1 << 20)
    assert window.admit("m1", 10, lambda: None, alarm.check_stop)
    alarm.blocked("pub-1", "low on memory")
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(StopDuringAlarm):
        window.admit("m2", 10, lambda: None, alarm.check_stop)
    assert time.monotonic() - started < 10.0  # ended by the stop, not left waiting for room
    assert window.pending() == ["m1"]


def test_the_status_says_which_broker_blocks_the_worker_and_forgets_it_after(tmp_path: Path) -> None:
    settings = Settings(job=JobSettings(id="alarm-job", scenario="split", steps=10, run_dir=str(tmp_path)))
    reporter = Reporter(settings, "cluster-b", "tail-0", "split-tail")
    reporter.record(3, {"loss": 0.5})
    alarm = BrokerAlarm("cluster-b")
    alarm.subscribe(lambda reason: reporter.broker_alarm(alarm.where, reason))

    def on_disk() -> dict[str, object]:
        return dict(json.loads((status_dir(settings) / "tail-0.json").read_text()))

    alarm.blocked("pub-1", "low on disk")  # (from a publisher's I/O thread in a worker)
    status = on_disk()
    assert status["broker_alarm"] == "cluster-b" and status["broker_alarm_reason"] == "low on disk"
    assert status["state"] == "running" and status["step"] == 3, "the state it had"
    assert reporter.last["broker_alarm"] == "cluster-b", "what the status feed publishes"
    reporter.record(4, {"loss": 0.4})
    assert on_disk()["broker_alarm"] == "cluster-b", "said until the alarm clears"
    alarm.unblocked("pub-1")
    status = on_disk()
    assert "broker_alarm" not in status and status["step"] == 4
