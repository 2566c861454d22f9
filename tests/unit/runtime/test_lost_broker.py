"""A broker that lost the job: an outage is waited out, a refused login twice in a row stops the
role with one BrokerDataLost naming what it needs (``runtime.lost_broker``)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import numpy as np
import pytest

from nebula_mq.codecs import Identity
from nebula_mq.errors import BrokerDataLost
from nebula_mq.runtime import lost_broker
from nebula_mq.runtime.channel import Outbox
from nebula_mq.runtime.lost_broker import BrokerWatch
from nebula_mq.runtime.ordered import FlowWindow, OrderedInbox
from nebula_mq.runtime.role import StepInputs
from nebula_mq.runtime.worker import Worker
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.channels import FLOW, pair  # noqa: F401  (the fixture)


@dataclass
class Link:
    connected: bool = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_waited_out_and_a_refusal_must_repeat(pair: tuple[Worker, Worker, MemoryBroker]) -> None:  # noqa: F811
    _, receiver, _ = pair
    link, clock, answers = Link(), Clock(), [None, None, "vhost v is gone", None, "vhost v is gone", "vhost v is gone"]
    asked: list[float] = []

    def probe() -> str | None:
        asked.append(clock.now)
        return answers.pop(0)

    watch = BrokerWatch(receiver, [link], probe=probe, clock=clock)  # type: ignore[list-item]
    watch.check(lambda: "x")
    assert asked == []  # connected: nothing asked
    link.connected = False
    for t in range(0, 12):
        clock.now = float(t)
        watch.check(lambda: "x")  # down: asked after the grace, then every PROBE_EVERY_S
    assert asked[0] == lost_broker.DOWN_GRACE_S and all(b - a >= lost_broker.PROBE_EVERY_S
                                                        for a, b in zip(asked, asked[1:]))
    assert len(asked) == 5  # outage, outage, refused, outage (resets), refused: not yet a loss
    link.connected = True
    watch.check(lambda: "x")  # reconnected: starts over
    assert watch.down_since is None and watch.refusals == 0
    link.connected = False
    answers[:] = ["vhost v is gone", "vhost v is gone"]
    clock.now = 100.0
    watch.check(lambda: "x")
    clock.now += lost_broker.DOWN_GRACE_S
    watch.check(lambda: "x")
    clock.now += lost_broker.PROBE_EVERY_S
    with pytest.raises(BrokerDataLost, match=r"needs x \(it has no checkpoint\)"):
        watch.check(lambda: "x")


def test_the_error_names_cluster_worker_range_and_checkpoint(pair: tuple[Worker, Worker, MemoryBroker]) -> None:  # noqa: F811
    sender, receiver, _ = pair
    receiver.store.save(2, {"w": np.zeros(1, np.float32)})
    inbox = OrderedInbox(receiver, StepInputs((FLOW,)), 0, FlowWindow(ahead=4, unacked=2))
    outbox = Outbox(sender, FLOW, "enc-0")
    for mb in (0, 1, 3):  # 2 never comes
        outbox.send(step=mb, micro_batch=mb, tensors={"x": (np.ones(2, np.float32), Identity())})
    got = []
    for _ in range(40):
        received = inbox.next(0.02)
        got += [r.micro_batch for r in inbox.take_from(0, received)] if received is not None else []
    assert got == [0, 1]
    link, clock = Link(connected=False), Clock()
    inbox.watch = BrokerWatch(receiver, [link], probe=lambda: "vhost nebula-x is gone", clock=clock)  # type: ignore[list-item]
    with pytest.raises(BrokerDataLost) as caught:
        for t in range(20):
            clock.now = float(t)
            inbox.next(0.0)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"{receiver.cluster}'s broker lost the job's data (vhost nebula-x is gone): "
                           f"{receiver.worker_id} needs micro-batches 2.. of flow '{FLOW.name}' (applied up to 1) "
                           "(its last checkpoint is step 2)"), text
    assert text.endswith("(see docs/faults.md: Recovering a broker that lost its data)")
    assert caught.value.reason == "broker_data_lost"
    inbox.close()
    outbox.close()


def test_a_wait_for_confirms_ends_in_the_same_error_on_the_inbox_thread_only(
        pair: tuple[Worker, Worker, MemoryBroker]) -> None:  # noqa: F811
    """A worker blocked on its broker's confirms (``Ledger.commit`` flushing its outboxes) when
    the broker comes back wiped must not wait out ``publish_patience_s``: the transport's wait
    checks run its inbox's watch, on the inbox's thread and until the inbox closes."""
    _, receiver, _ = pair
    inbox = OrderedInbox(receiver, StepInputs((FLOW,)), 0, FlowWindow(ahead=4, unacked=2))
    link, clock = Link(connected=False), Clock()
    inbox.watch = BrokerWatch(receiver, [link], probe=lambda: "vhost nebula-x is gone", clock=clock)  # type: ignore[list-item]
    elsewhere: list[BaseException] = []

    def other_thread() -> None:  # e.g. a status publisher's wait: never the role's error
        try:
            for t in range(20):
                clock.now = float(t)
                receiver.transport.wait_checks()
        except BaseException as exc:  # noqa: BLE001 (collected for the assert)
            elsewhere.append(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and elsewhere == []
    with pytest.raises(BrokerDataLost, match=r"needs micro-batches 0\.\. of flow"):
        for t in range(20, 40):
            clock.now = float(t)
            receiver.transport.wait_checks()
    inbox.close()
    for t in range(40, 60):  # closed: its watch is no longer asked
        clock.now = float(t)
        receiver.transport.wait_checks()


def test_a_memory_transport_never_loses_its_job(pair: tuple[Worker, Worker, MemoryBroker]) -> None:  # noqa: F811
    from nebula_mq.transport.job_presence import transport_job_gone

    assert transport_job_gone(pair[1].transport) is None


def test_a_broker_provisioned_again_is_not_the_one_of_the_checkpoints(
        pair: tuple[Worker, Worker, MemoryBroker]) -> None:  # noqa: F811
    _, receiver, _ = pair
    note = receiver.store.root / lost_broker.INCARNATION_FILE
    link = Link()
    BrokerWatch(receiver, [link], markers=lambda: None).opened(lambda: "x")  # type: ignore[list-item]
    assert not note.exists()  # the broker cannot say: nothing noted
    BrokerWatch(receiver, [link], markers=lambda: ["t1", "t2"]).opened(lambda: "x")  # type: ignore[list-item]
    assert json.loads(note.read_text())["incarnation"] == "t1"  # no checkpoint yet: the oldest noted
    receiver.store.save(5, {"w": np.zeros(1, np.float32)})
    BrokerWatch(receiver, [link], markers=lambda: ["t1", "t3"]).opened(lambda: "x")  # type: ignore[list-item]
    with pytest.raises(BrokerDataLost) as caught:  # wiped and provisioned again: t1 is gone
        BrokerWatch(receiver, [link], markers=lambda: ["t4"]).opened(lambda: "x")  # type: ignore[list-item]
    assert "was provisioned again since" in str(caught.value) and "incarnation t1 is gone, the broker has t4" in str(
        caught.value) and "needs x (its last checkpoint is step 5)" in str(caught.value)
    note.unlink()  # what the recovery does once both sides are rolled back: the new broker is noted
    BrokerWatch(receiver, [link], markers=lambda: ["t4"]).opened(lambda: "x")  # type: ignore[list-item]
    assert json.loads(note.read_text())["incarnation"] == "t4"
