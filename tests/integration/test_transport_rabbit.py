"""RabbitMQ-only transport behaviour on the default node: crashes, heartbeats, reconnects."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nebula_mq.errors import AccessRefused, TransportError
from nebula_mq.settings import BrokerSettings, TransportSettings
from nebula_mq.topology import Flow
from nebula_mq.transport.rabbit import RabbitTransport
from tests.fixtures.exactly_once import applied_before_kill_at_m5, apply_once

pytestmark = pytest.mark.broker

DEFAULT_NODE = BrokerSettings(host="127.0.0.1", port=5672, tls=False, heartbeat_s=10)
SETTINGS = TransportSettings(max_queue_bytes=1024 * 1024, publish_patience_s=10)


@pytest.fixture
def transport() -> Iterator[RabbitTransport]:
    t = RabbitTransport(DEFAULT_NODE, SETTINGS, f"t-{uuid.uuid4().hex[:10]}", "a")
    t.open()
    yield t
    t.close()
    t.delete_queue(t.queue_for("f"))
    t.delete_queue(t.dead_letter_queue)


def _local_queue(t: RabbitTransport) -> str:
    return t.declare_flow(Flow("f", "a", "a"), "producer")


def test_kill_9_consumer_replays_unacked_and_applies_exactly_once(
    transport: RabbitTransport, tmp_path: Path
) -> None:
    q = _local_queue(transport)
    with transport.publisher() as pub:
        for i in range(10):
            pub.publish(q, b"x%d" % i, f"m{i}")
    applied = applied_before_kill_at_m5(transport.job_id, "a", q, DEFAULT_NODE, tmp_path)
    done = set(applied)
    discarded: list[tuple[str, bool]] = []
    with transport.consume(q) as consumer:
        while (d := consumer.get(timeout=2.0)) is not None:
            if apply_once(d, done, applied):
                discarded.append((d.message_id, d.redelivered))
    assert ("m5", True) in discarded  # applied before the kill, replayed, discarded
    assert applied == [f"m{i}" for i in range(10)]
    assert transport.queue_depth(q) == 0


def test_heartbeats_survive_a_long_compute_step(transport: RabbitTransport) -> None:
    """heartbeat=4 and 15 s of "compute" in this thread: the I/O threads answer."""
    fast = RabbitTransport(
        BrokerSettings(host="127.0.0.1", port=5672, tls=False, heartbeat_s=4),
        SETTINGS, transport.job_id, "a",
    )
    q = _local_queue(fast)
    pub = fast.publisher()
    pub.publish(q, b"x", "m0")
    consumer = fast.consume(q)
    d = consumer.get(timeout=5)
    assert d is not None
    time.sleep(15)  # compute, holding the delivery unacked
    assert consumer.connected and pub.connected.is_set()
    assert d.ack() is True  # same channel: the connection never dropped
    assert consumer.reconnects == 0 and pub.reconnects == 0
    pub.publish(q, b"y", "m1")
    assert pub.stats.waits_disconnected == 0
    d1 = consumer.get(timeout=5)
    assert d1 is not None and d1.message_id == "m1" and not d1.redelivered
    assert d1.ack()
    assert consumer.get(timeout=0.5) is None
    fast.close()


def _close_connection(name: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = subprocess.run(
            ["rabbitmqctl", "-q", "list_connections", "pid", "client_properties"],
            capture_output=True, text=True, timeout=30,
        ).stdout
        for line in listed.splitlines():
            pid, _, properties = line.partition("\t")
            if f'{{"connection_name","{name}"}}' in properties:
                subprocess.run(
                    ["rabbitmqctl", "-q", "close_connection", pid, "test: simulated loss"],
                    check=True, capture_output=True, timeout=30,
                )
                return
        time.sleep(0.5)
    raise AssertionError(f"connection {name!r} not listed by the broker")


def test_consumer_and_publisher_reconnect_and_unacked_is_replayed(
    transport: RabbitTransport,
) -> None:
    q = _local_queue(transport)
    pub = transport.publisher()
    pub.publish(q, b"x", "m0")
    consumer = transport.consume(q)
    d = consumer.get(timeout=5)
    assert d is not None and not d.redelivered
    _close_connection(consumer.connection_name)
    again = consumer.get(timeout=15)  # re-subscribed on a new connection
    assert again is not None and again.message_id == "m0" and again.redelivered
    assert consumer.reconnects == 1
    assert d.ack() is False  # its channel died with the connection; the replay counts
    assert again.ack() is True

    _close_connection(pub.connection_name)
    pub.publish(q, b"y", "m1")  # waits for the reconnect, then goes through
    d1 = consumer.get(timeout=5)
    assert d1 is not None and d1.message_id == "m1"
    assert d1.ack()
    assert pub.reconnects == 1


def test_wrong_credentials_and_vhost_are_access_refused() -> None:
    bad_password = BrokerSettings(host="127.0.0.1", port=5672, tls=False, password="nope")
    with pytest.raises(AccessRefused):
        RabbitTransport(bad_password, SETTINGS, "t-x", "a").open()
    no_vhost = BrokerSettings(host="127.0.0.1", port=5672, tls=False, vhost="nebula-missing")
    with pytest.raises(AccessRefused):
        RabbitTransport(no_vhost, SETTINGS, "t-x", "a").open()


def test_consuming_a_missing_queue_is_a_transport_error(transport: RabbitTransport) -> None:
    with pytest.raises(TransportError, match="404"):
        transport.consume(transport.queue_for("f"))
    assert transport.queue_depth(transport.queue_for("f")) is None


def test_consumer_resubscribes_after_its_queue_is_deleted_and_redeclared(
    transport: RabbitTransport,
) -> None:
    q = _local_queue(transport)
    consumer = transport.consume(q)
    transport.delete_queue(q)  # the broker cancels the subscription
    time.sleep(0.5)
    _local_queue(transport)
    with transport.publisher() as pub:
        pub.publish(q, b"x", "m0")
    d = consumer.get(timeout=15)
    assert d is not None and d.message_id == "m0"
    assert d.ack()
    assert consumer.reconnects >= 1
