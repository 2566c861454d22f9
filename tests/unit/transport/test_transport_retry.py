"""The publishers' one retry decision (``retry.Patience``), as the in-memory transport meets it,
and the pieces of the RabbitMQ publisher that need no broker: its window and its confirm table."""

from __future__ import annotations

import threading
import time

import pytest

from nebula_mq import topology
from nebula_mq.errors import BackpressureTimeout, ConnectionLost, PublishRejected, TransportError, Unroutable
from nebula_mq.settings import TransportSettings
from nebula_mq.transport.base import Outgoing
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport
from nebula_mq.transport.publisher import Confirms, PublishWindow, Unconfirmed
from nebula_mq.transport.retry import Patience, PublishStats

FLOW = topology.Flow("activations", "cluster-a", "cluster-a")


def test_each_wait_is_counted_by_its_cause_and_bounded_by_the_backoff() -> None:
    stats = PublishStats()
    patience = Patience("q", "m-1", 30.0, stats)
    waits = [patience.next_wait(why) for why in (PublishRejected("full"), Unroutable("none"), ConnectionLost("gone"))]
    assert all(w is not None and 0 < w <= 0.5 for w in waits)
    assert (stats.waits_full, stats.waits_unroutable, stats.waits_disconnected) == (1, 1, 1)
    assert stats.waited_s >= sum(w for w in waits if w is not None)
    patience.published()
    assert stats.published == 1


def test_a_spent_patience_gives_up_with_the_error_of_its_last_cause() -> None:
    patience = Patience("q", "m-1", 0.0, PublishStats())
    assert patience.next_wait(PublishRejected("queue 'q' is full")) is None
    timeout = patience.gave_up(PublishRejected("queue 'q' is full"))
    assert isinstance(timeout, BackpressureTimeout)
    assert str(timeout) == "publish to 'q' not accepted within 0.0 s: queue 'q' is full"
    lost = patience.gave_up(ConnectionLost("gone"))
    assert type(lost) is ConnectionLost and str(lost) == "publish to 'q': broker unreachable for 0.0 s"


def test_the_memory_publisher_waits_out_a_full_queue_as_the_rabbit_publisher_does() -> None:
    broker = MemoryBroker()
    settings = TransportSettings(max_queue_bytes=4, publish_patience_s=0.3)
    transport = MemoryTransport(broker, settings, "job", "cluster-a")
    queue = transport.declare_flow(FLOW, "producer")
    pub = transport.publisher()
    pub.publish(queue, b"1234", "m-1")
    t0 = time.monotonic()
    with pytest.raises(BackpressureTimeout, match=r"not accepted within 0.3 s: queue .* is full"):
        pub.publish(queue, b"5", "m-2")
    assert 0.25 < time.monotonic() - t0 < 10.0  # the patience, then gives up: never waits for ever
    assert pub.stats.published == 1 and pub.stats.waits_full > 1 and pub.stats.waits_unroutable == 0


def test_the_memory_publisher_sends_again_once_the_queue_exists() -> None:
    broker = MemoryBroker()
    transport = MemoryTransport(broker, TransportSettings(publish_patience_s=10), "job", "cluster-a")
    queue = transport.queue_for(FLOW)
    pub = transport.publisher()

    def declare_once_returned() -> None:  # the queue comes while the publish waits, whichever is faster
        deadline = time.monotonic() + 30
        while pub.stats.waits_unroutable == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        transport.declare_flow(FLOW, "producer")

    threading.Thread(target=declare_once_returned, daemon=True).start()
    pub.publish(queue, b"late", "m-1")
    assert pub.stats.published == 1 and pub.stats.waits_unroutable > 0
    assert transport.queue_depth(queue) == 1


def test_the_window_bounds_messages_and_bytes_and_frees_room_on_settle() -> None:
    window: PublishWindow[str] = PublishWindow(messages=2, size_bytes=10)
    handed: list[str] = []
    assert window.admit("a", 4, lambda: handed.append("a"))
    assert window.admit("b", 4, lambda: handed.append("b"))
    threading.Timer(0.2, window.settle, ("a",)).start()
    assert window.admit("c", 6, lambda: handed.append("c"))
    # Waited for "a", however late the timer fired: never three outstanding at once.
    assert handed == ["a", "b", "c"] and len(window) == 2 and window.max_in_flight == 2
    window.close()
    assert not window.admit("d", 1, lambda: handed.append("d")) and handed[-1] == "c"


def test_confirms_settle_by_tag_and_multiple_and_start_again_on_a_new_channel() -> None:
    confirms = Confirms()
    messages = [Unconfirmed.of(Outgoing("q", b"x", f"m{i}"), "", Patience("q", f"m{i}", 1.0, PublishStats()))
                for i in range(4)]
    for m in messages:
        confirms.sent(m)  # tags 1..4
    confirms.returned("m1")
    assert messages[1].returned and not messages[0].returned
    assert confirms.settle(2, multiple=True) == messages[:2]
    assert confirms.settle(2, multiple=False) == []  # each once
    assert confirms.settle(4, multiple=False) == [messages[3]]
    assert confirms.take_all() == [messages[2]] and confirms.take_all() == []
    confirms.new_channel()
    confirms.sent(messages[2])
    assert confirms.settle(1, multiple=False) == [messages[2]]


def test_a_dead_letter_reaches_the_dead_letter_queue_with_its_reason() -> None:
    broker = MemoryBroker()
    transport = MemoryTransport(broker, TransportSettings(), "job", "cluster-a")
    dlq = transport.declare_dead_letter_queue()
    transport.dead_letter(b"bad", "m-1", "malformed", "crc", original_queue="q", headers={"k": "v"})
    with transport.consume(dlq) as consumer:
        delivery = consumer.get(timeout=1)
        assert delivery is not None and delivery.body == b"bad"
        assert delivery.headers["x-nebula-reason"] == "malformed" and delivery.headers["k"] == "v"
    with pytest.raises(TransportError):
        transport.consume("nowhere")
