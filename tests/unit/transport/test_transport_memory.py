"""The in-memory broker of the worker unit tests: waits end when it goes down."""

from __future__ import annotations

import threading
import time

import pytest

from nebula_mq import topology
from nebula_mq.errors import TransportError
from nebula_mq.settings import TransportSettings
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport

FLOW = topology.Flow("activations", "cluster-a", "cluster-b")


def test_a_consumer_waiting_without_a_timeout_wakes_with_an_error_when_the_broker_goes_down() -> None:
    broker = MemoryBroker()
    transport = MemoryTransport(broker, TransportSettings(), "job", "cluster-b")
    consumer = transport.consume(transport.declare_flow(FLOW, "consumer"), prefetch=1)
    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            consumer.get(None)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()  # it really is waiting
    broker.shutdown("the producer died")
    waiter.join(5)
    assert not waiter.is_alive()
    assert isinstance(outcome[0], TransportError) and "the producer died" in str(outcome[0])


def test_a_publish_to_a_broker_that_is_down_fails_at_once() -> None:
    broker = MemoryBroker()
    transport = MemoryTransport(broker, TransportSettings(publish_patience_s=30.0), "job", "cluster-a")
    queue = transport.declare_flow(FLOW, "producer")
    broker.shutdown("test over")
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="test over"):
        transport.publisher().publish(queue, b"x", "m-1")
    assert time.monotonic() - t0 < 10.0  # not its 30 s patience
