"""The queue sampler runs on its own thread: a slow or failing broker costs samples, never steps."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nebula_mq.errors import TransportError
from nebula_mq.runtime import sampler
from nebula_mq.settings import JobSettings, Settings, TransportSettings
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport
from nebula_mq.transport.probe import ReadThroughProbe
from nebula_mq.runtime.worker import Worker
from tests.fixtures.channels import FLOW, bare

STEPS = 20


class ScriptedProbe(ReadThroughProbe):
    """Reads the in-memory broker, but its ``n``-th call to ``queue_depth`` (from 1) first does
    what ``script`` maps ``n`` to: sleep, block, raise."""

    def __init__(self, transport: MemoryTransport, script: dict[int, Callable[[], None]]) -> None:
        super().__init__(transport)
        self.script = script
        self.calls = 0
        self.entered = threading.Event()  # a scripted call has begun
        self.answering = threading.Event()  # a scripted call is under way

    def queue_depth(self, queue: str) -> int | None:
        self._check()  # the probe's thread rule, as pika's
        self.calls += 1
        action = self.script.get(self.calls)
        if action is not None:
            self.answering.set()
            self.entered.set()
            try:
                action()
            finally:
                self.answering.clear()
        return super().queue_depth(queue)


class ProbedTransport(MemoryTransport):
    def __init__(self, broker: MemoryBroker, settings: TransportSettings, script: dict[int, Callable[[], None]]):
        super().__init__(broker, settings, "chan", "t")
        self.probe = ScriptedProbe(self, script)

    def queue_probe(self) -> ScriptedProbe:
        return self.probe


def probe(w: Worker) -> ScriptedProbe:
    assert isinstance(w.sampler.probe, ScriptedProbe)
    return w.sampler.probe


def worker(tmp: Path, script: dict[int, Callable[[], None]]) -> Worker:
    """A worker on cluster t that reads FLOW's queue, which holds three 100-byte messages."""
    settings = Settings(job=JobSettings(id="chan", run_dir=str(tmp)), transport=TransportSettings(publish_patience_s=5.0))
    transport = ProbedTransport(MemoryBroker(), settings.transport, script)
    w = bare(settings, "t", "dec-0", transport)
    queue = transport.declare_flow(FLOW, "consumer")
    transport.declare_dead_letter_queue()
    with transport.publisher() as pub:
        for i in range(3):
            pub.publish(queue, bytes(100), f"m{i}")
    w.watched_queues.add(queue)
    return w


def record_steps(w: Worker) -> None:
    """Record STEPS steps, as a training loop does."""
    for step in range(1, STEPS + 1):
        w.step = step
        w.record_step({"loss": 1.0 / step})


def rows(w: Worker) -> list[dict[str, float]]:
    path = w.settings.run_dir / "queues" / "dec-0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_slow_broker_delays_no_step_and_the_sampler_writes_its_rows_afterwards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler, "QUEUE_SAMPLE_S", 0.01)
    overlapped: list[bool] = []
    answer = threading.Event()

    def body(w: Worker) -> int:
        w.record_step({"loss": 1.0})  # the sampler's first sample comes at the first step
        assert probe(w).entered.wait(30), "the sampler never sampled"
        record_steps(w)
        overlapped.append(probe(w).answering.is_set())
        answer.set()
        return 0

    # The broker answers its first sample only once the steps are recorded: steps that waited
    # for the sampler would find it answered (after the 30 s) instead, however loaded the machine.
    w = worker(tmp_path, {1: lambda: answer.wait(30)})
    with capture_logs() as logs:
        assert w.lifecycle(lambda: body(w)) == 0
    assert overlapped == [True]  # the steps ran while the sampler waited
    assert not [e for e in logs if e["log_level"] == "warning"]  # and no thread broke the probe's rule
    assert w.sampler.thread is not None and not w.sampler.thread.is_alive()  # joined as main left
    assert probe(w).closed and probe(w).owner is w.sampler.thread  # one thread read the broker: the sampler's
    queue = w.transport.queue_for(FLOW)
    last = {row["queue"]: row for row in rows(w)}  # the final sample's rows are the last ones
    assert last[queue]["messages"] == 3 and last[queue]["bytes"] == 300
    assert last[w.transport.dead_letter_queue]["messages"] == 0
    assert w.report.metrics.of(w.report.metrics.queue_messages, queue)._value.get() == 3.0
    # Each sample also went to the status feed, from the sampler's thread; the last one says the
    # worker finished, at its last step, with the queues as it left them.
    published = probe(w).published
    assert published and {(x, key) for x, key, _ in published} == {("nebula.chan.status.x", "dec-0")}
    final = json.loads(published[-1][2])
    assert final["state"] == "finished" and final["step"] == STEPS and final["worker"] == "dec-0"
    assert final["queues"][queue] == {"messages": 3, "bytes": 300} and final["host"]


def test_a_sampler_stuck_on_the_broker_lets_the_worker_leave_within_its_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler, "QUEUE_SAMPLE_S", 0.01)
    monkeypatch.setattr(sampler, "STOP_WAIT_S", 0.3)
    release = threading.Event()

    def body(w: Worker) -> int:
        w.record_step({"loss": 1.0})
        assert probe(w).entered.wait(30)
        return 0

    w = worker(tmp_path, {1: lambda: release.wait(30)})  # a broker that never answers
    try:
        started = time.monotonic()
        with capture_logs() as logs:
            assert w.lifecycle(lambda: body(w)) == 0
        assert time.monotonic() - started < 15.0  # the bound, not the broker's 30 s
        assert [e for e in logs if e["event"] == "queue_sampler_stuck"]
        assert json.loads((tmp_path / "status" / "dec-0.json").read_text())["state"] == "finished"
    finally:
        release.set()
    thread = w.sampler.thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive() and probe(w).closed


def test_failed_samples_are_logged_and_never_reach_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler, "QUEUE_SAMPLE_S", 0.01)

    def broker_error() -> None:
        raise TransportError("inspect queue: connection lost")

    def bug() -> None:
        raise RuntimeError("a bug in the probe")

    def body(w: Worker) -> int:
        deadline = time.monotonic() + 60
        while probe(w).calls < 6:
            assert time.monotonic() < deadline, "the sampler stopped sampling after a failure"
            record_steps(w)
        return 0

    w = worker(tmp_path, {1: broker_error, 2: bug})
    with capture_logs() as logs:
        assert w.lifecycle(lambda: body(w)) == 0
    failed = [e for e in logs if e["event"] == "queue_sample_failed"]
    assert [e["error"] for e in failed] == ["inspect queue: connection lost", "RuntimeError: a bug in the probe"]
    assert rows(w)  # and sampling went on


def test_the_status_goes_out_when_the_queues_cannot_be_read(tmp_path: Path) -> None:
    """A rank on a host that cannot reach the broker's management API is still heard by the
    job's status feed, without queue depths."""
    def refused() -> None:
        raise TransportError("management API GET queues: [Errno 111] Connection refused")

    def body(w: Worker) -> int:
        w.record_step({"loss": 1.0})
        assert probe(w).entered.wait(5), "the sampler never sampled"
        return 0

    w = worker(tmp_path, {1: refused})  # the first sample fails
    with capture_logs() as logs:
        assert w.lifecycle(lambda: body(w)) == 0
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["queue_sample_failed"]
    published = probe(w).published
    assert {(x, key) for x, key, _ in published} == {(w.sampler.status_exchange, "dec-0")}
    first, last = json.loads(published[0][2]), json.loads(published[-1][2])
    assert first["worker"] == "dec-0" and first["queues"] == {}, published
    assert last["state"] == "finished" and last["queues"][w.transport.queue_for(FLOW)] == {"messages": 3, "bytes": 300}
