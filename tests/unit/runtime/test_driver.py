"""The runtime owns the loop (``nebula_mq.runtime.driver``): a role is a plain object that only
says what a step does and what its state is; ordering, dedupe, checkpoints, acks and stopping
are the driver's."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nebula_mq.codecs import Identity
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.checkpoint import Checkpoint
from nebula_mq.runtime.driver import Driver, Extras, StepInputs, StopCheck
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import JobSettings, Settings, TransportSettings
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport
from tests.fixtures.channels import FLOW, dead_letters, make
from workers.base import WorkerIdentity

STEPS = 6


class Summing:
    """A role whose step adds the message's value to a running sum."""

    def __init__(self, tmp: Path, broker: MemoryBroker, *, stop_after: int = -1, crash_at: int = -1,
                 sources: tuple[str, ...] = ()) -> None:
        settings = Settings(job=JobSettings(id="chan", run_dir=str(tmp), steps=STEPS),
                            transport=TransportSettings(publish_patience_s=5.0))
        self.worker = WorkerIdentity(settings, "t", "dec-0", "test-sum", 4).worker(
            MemoryTransport(broker, settings.transport, "chan", "t"))
        self.total, self.in_flight, self.sources = STEPS, 2, sources
        self.sum = 0.0
        self.applied: list[int] = []
        self.stop_after, self.crash_at = stop_after, crash_at

    def apply(self, parts: tuple[Received, ...]) -> Mapping[str, float]:
        mb = parts[0].micro_batch
        if mb == self.crash_at:
            raise RuntimeError("crash")
        # The runtime hands out step s's messages at step s, one per source, in source order.
        assert [p.micro_batch for p in parts] == [self.worker.step] * max(1, len(self.sources))
        assert [p.envelope.producer for p in parts] == list(self.sources or [parts[0].envelope.producer])
        self.applied.append(mb)
        self.sum += sum(float(p.tensors["x"][0]) for p in parts)
        if mb == self.stop_after:
            self.worker.stop_requested.set()  # as SIGTERM's handler does
        return {"sum": self.sum}

    def inputs(self) -> StepInputs:
        return StepInputs((FLOW,), self.sources)

    def extras(self) -> Extras:
        return Extras()

    def open(self) -> None: ...

    def close(self) -> None: ...

    def produce(self, stopping: StopCheck) -> None: ...

    def run(self) -> int:
        """The driver's loop, with this role, on the open transport."""
        with self.worker.transport:
            return Driver(self.worker, self).run()

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {"sum": np.array([self.sum])}, {}

    def load(self, ck: Checkpoint) -> None:
        self.sum = float(ck.arrays["sum"][0])


def send(sender: Worker, order: list[int], producer: str = "enc-0", scale: float = 1.0) -> None:
    outbox = Outbox(sender, FLOW, producer)
    for mb in order:
        outbox.send(step=mb, micro_batch=mb, tensors={"x": (np.array([scale * 10.0 ** mb]), Identity())})
    outbox.close()


def setup(tmp: Path) -> tuple[Worker, MemoryBroker]:
    broker = MemoryBroker()
    sender = make(tmp, broker, "s", "enc-0")
    sender.transport.declare_flow(FLOW, "producer")
    return sender, broker


def test_each_step_is_applied_once_in_order_and_everything_is_acked_after_its_checkpoint(tmp_path: Path) -> None:
    sender, broker = setup(tmp_path)
    role = Summing(tmp_path, broker)
    send(sender, [2, 0, 1, 1, 3, 5, 0, 4])  # out of order, 0 and 1 twice
    assert role.run() == 0
    assert role.applied == list(range(STEPS)) and role.sum == 111111.0
    assert role.worker.store.steps() == [4, 6]  # every checkpoint_every steps and at the last
    assert role.worker.store.latest().arrays["sum"][0] == 111111.0  # type: ignore[union-attr]
    # Nothing came back to the queue when the consumer closed: repeats included, all were acked.
    assert role.worker.transport.queue_depth(role.worker.transport.queue_for(FLOW)) == 0
    assert dead_letters(role.worker) == []


def test_a_stop_request_ends_the_step_checkpoints_it_and_a_restart_goes_on_from_there(tmp_path: Path) -> None:
    sender, broker = setup(tmp_path)
    send(sender, list(range(STEPS)))
    first = Summing(tmp_path, broker, stop_after=2)
    assert first.run() == 0
    assert first.applied == [0, 1, 2] and first.worker.store.steps() == [3]  # the stop's own checkpoint
    # What was not applied is still on the broker, unacked: the restart gets it.
    second = Summing(tmp_path, broker)
    assert second.run() == 0
    assert second.applied == [3, 4, 5] and second.sum == 111111.0


def test_a_crash_loses_nothing_and_applies_nothing_twice(tmp_path: Path) -> None:
    """Steps after the last checkpoint are unacked: a crashed worker's restart applies them
    once, from the checkpoint's state, never on top of the lost in-memory state."""
    sender, broker = setup(tmp_path)
    send(sender, list(range(STEPS)))
    first = Summing(tmp_path, broker, crash_at=5)
    with pytest.raises(RuntimeError, match="crash"):
        first.run()
    assert first.applied == [0, 1, 2, 3, 4] and first.worker.store.steps() == [4]  # step 5 was never saved
    second = Summing(tmp_path, broker)
    assert second.run() == 0
    assert second.applied == [4, 5] and second.sum == 111111.0  # 4 again, from the step-4 state


def test_a_kill_just_after_a_checkpoint_leaves_the_history_whole(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The loss curve has every step whenever a worker dies: the rows a checkpoint covers are
    written before it is saved (a kill between the two redoes those steps and their rows; the
    report keeps a step's last row)."""
    sender, broker = setup(tmp_path)
    send(sender, list(range(STEPS)))
    first = Summing(tmp_path, broker)
    save = first.worker.store.save

    def save_then_die(*args: Any, **kwargs: Any) -> Checkpoint:
        save(*args, **kwargs)
        raise SystemExit("killed just after the checkpoint is in place")

    monkeypatch.setattr(first.worker.store, "save", save_then_die)
    with pytest.raises(SystemExit):
        first.run()
    assert first.worker.store.steps() == [4]
    second = Summing(tmp_path, broker)
    assert second.run() == 0 and second.applied == [4, 5]
    history = (tmp_path / "history" / "dec-0.jsonl").read_text().splitlines()
    assert sorted({int(json.loads(line)["step"]) for line in history}) == list(range(1, STEPS + 1)), history


def test_a_step_of_several_sources_waits_for_each_and_a_stranger_is_dead_lettered(tmp_path: Path) -> None:
    """A data-parallel tail rank's step is one message from each head rank (``sources``)."""
    sender, broker = setup(tmp_path)
    send(sender, [0], producer="intruder")
    send(sender, [1, 0, 2, 3, 4, 5], producer="enc-0")
    send(sender, [0, 1, 1, 2, 4, 3], producer="enc-0-r1", scale=2.0)  # out of order, 1 twice
    role = Summing(tmp_path, broker, sources=("enc-0", "enc-0-r1"))
    role.total = 5  # enc-0 sent step 5 too: a step needs both
    assert role.run() == 0
    assert role.applied == [0, 1, 2, 3, 4] and role.sum == 3 * 11111.0
    reasons = dead_letters(role.worker)
    assert reasons == ["malformed"]  # the stranger, and nothing else


class Producing(Summing):
    """A role that, like a split head, sends ahead of its step: it records the step at which
    each micro-batch would go out."""

    def __init__(self, tmp: Path, broker: MemoryBroker) -> None:
        super().__init__(tmp, broker)
        self.sent_at: dict[int, int] = {}
        self.next_out = 0

    def produce(self, stopping: StopCheck) -> None:
        while self.next_out < min(self.total, self.worker.step + self.in_flight):
            self.sent_at[self.next_out] = self.worker.step
            self.next_out += 1


def test_what_a_role_sends_depends_on_its_step_not_on_how_many_steps_one_arrival_completes(tmp_path: Path) -> None:
    """5, 4, 3, 2, 1 wait for 0; its arrival completes six steps at once. Each step's sends still
    go out right after it, as if the messages had come one by one (a split head's activation of
    micro-batch m is computed after exactly m - in_flight + 1 gradients)."""
    sender, broker = setup(tmp_path)
    role = Producing(tmp_path, broker)
    send(sender, [5, 4, 3, 2, 1, 0])
    assert role.run() == 0
    assert role.applied == list(range(STEPS))
    assert role.sent_at == {mb: max(0, mb - role.in_flight + 1) for mb in range(STEPS)}


def test_a_worker_whose_peer_is_silent_says_whom_it_waits_for_and_stops_saying_once_it_hears(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No wait is silent: past WAIT_NOTICE_S without a message the worker's status names what it
    waits for and since when (what ``run``, ``up`` and ``status`` show); the next message clears it."""
    import threading

    from nebula_mq.runtime import driver

    monkeypatch.setattr(driver, "WAIT_NOTICE_S", 0.6)
    sender, broker = setup(tmp_path)
    role = Summing(tmp_path, broker, sources=("enc-0", "enc-1"))
    status = tmp_path / "status" / "dec-0.json"

    def waiting_for() -> str:
        return str(json.loads(status.read_text()).get("waiting_for", "")) if status.exists() else ""

    done = threading.Event()
    runner = threading.Thread(target=lambda: (role.run(), done.set()), daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while not waiting_for():
        assert time.monotonic() < deadline and not done.is_set()
        time.sleep(0.05)
    assert waiting_for().startswith("activations from enc-0, enc-1 on s: nothing yet (")
    send(sender, list(range(STEPS)), producer="enc-0")  # one of the two sources: no step yet
    deadline = time.monotonic() + 30
    while "nothing for" not in waiting_for():  # heard enc-0, and enc-1 still silent
        assert time.monotonic() < deadline, waiting_for()
        time.sleep(0.05)
    send(sender, list(range(STEPS)), producer="enc-1")
    runner.join(30)
    assert done.is_set() and role.applied == list(range(STEPS))
    assert waiting_for() == ""  # the steps' statuses carry no wait
