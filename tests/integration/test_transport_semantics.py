"""The transport contract, run against RabbitMQ (default node) and the memory transport.

Same test functions, both implementations: what the worker runtime's unit
tests assume of ``MemoryTransport`` is checked here against the real broker.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from nebula_mq.errors import BackpressureTimeout, TransportError
from nebula_mq.settings import BrokerSettings, TransportSettings
from nebula_mq.topology import Flow
from nebula_mq.transport import base
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport

DEFAULT_NODE = BrokerSettings(host="127.0.0.1", port=5672, tls=False, heartbeat_s=10)
MiB = 1024 * 1024

MakeTransport = Callable[..., base.Transport]


@pytest.fixture(params=["memory", pytest.param("rabbit", marks=pytest.mark.broker)])
def make_transport(request: pytest.FixtureRequest) -> Iterator[MakeTransport]:
    """``make_transport(settings=None, cluster="a")``: one job per test, cleaned up after."""
    job_id = f"t-{uuid.uuid4().hex[:10]}"
    memory = MemoryBroker()
    made: list[base.Transport] = []

    def make(settings: TransportSettings | None = None, cluster: str = "a") -> base.Transport:
        settings = settings or TransportSettings(max_queue_bytes=MiB, publish_patience_s=10)
        if request.param == "memory":
            transport: base.Transport = MemoryTransport(memory, settings, job_id, cluster)
        else:
            from nebula_mq.transport.rabbit import RabbitTransport

            transport = RabbitTransport(DEFAULT_NODE, settings, job_id, cluster)
        transport.open()
        made.append(transport)
        return transport

    yield make
    for transport in made:
        transport.close()
    if made:
        for flow in ("f", "g", "dup", "bp"):
            made[0].delete_queue(made[0].queue_for(flow))
        made[0].delete_queue(made[0].dead_letter_queue)


def _local(t: base.Transport, name: str = "f") -> str:
    flow = Flow(name, t.cluster, t.cluster)
    t.declare_flow(flow, "producer")
    return t.declare_flow(flow, "consumer")  # same queue, same arguments: no conflict


def test_round_trip_keeps_body_and_properties(make_transport: MakeTransport) -> None:
    t = make_transport()
    q = _local(t)
    with t.publisher() as pub:
        for i in range(5):
            pub.publish(q, memoryview(b"body-%d" % i), f"m{i}", headers={"step": i}, correlation_id=f"c{i}",
                        reply_to="reply-q")
    with t.consume(q) as consumer:
        for i in range(5):
            d = consumer.get(timeout=5)
            assert d is not None
            assert (bytes(d.body), d.message_id, d.headers["step"]) == (b"body-%d" % i, f"m{i}", i)
            assert (d.correlation_id, d.reply_to, d.redelivered, d.queue) == (f"c{i}", "reply-q", False, q)
            assert d.ack() is True
        assert consumer.get(timeout=0.3) is None
    assert t.queue_depth(q) == 0


def test_prefetch_bounds_unacked_and_double_ack_is_refused(make_transport: MakeTransport) -> None:
    t = make_transport()
    q = _local(t)
    with t.publisher() as pub:
        for i in range(4):
            pub.publish(q, b"x", f"m{i}")
    with t.consume(q, prefetch=2) as consumer:
        first, second = consumer.get(timeout=5), consumer.get(timeout=5)
        assert first is not None and second is not None
        assert consumer.get(timeout=0.5) is None  # two unacked: nothing more comes
        assert first.ack()
        with pytest.raises(TransportError):
            first.ack()
        third = consumer.get(timeout=5)
        assert third is not None and third.message_id == "m2"


def test_unacked_are_redelivered_after_close_and_dedupe_discards_repeats(
    make_transport: MakeTransport,
) -> None:
    t = make_transport()
    q = _local(t)
    with t.publisher() as pub:
        for i in range(4):
            pub.publish(q, b"x%d" % i, f"m{i}")
        pub.publish(q, b"x0", "m0")  # a publish retry's repeat, same id
    done: set[str] = set()  # the ids applied: the consumer's memory of repeats
    consumer = t.consume(q, prefetch=10)
    d0, d1 = consumer.get(timeout=5), consumer.get(timeout=5)
    assert d0 is not None and d1 is not None
    done.add(d0.message_id)
    assert d0.ack()
    done.add(d1.message_id)  # applied and checkpointed, then the consumer dies unacked
    consumer.close()

    applied: list[str] = [d0.message_id, d1.message_id]
    redelivered: dict[str, bool] = {}
    with t.consume(q, prefetch=10) as again:
        while (d := again.get(timeout=1.0)) is not None:
            redelivered[d.message_id] = d.redelivered
            if d.message_id not in done:
                done.add(d.message_id)
                applied.append(d.message_id)
            assert d.ack()
    assert redelivered["m1"] is True
    assert applied == ["m0", "m1", "m2", "m3"]
    assert t.queue_depth(q) == 0


def test_backpressure_blocks_producer_and_loses_nothing(make_transport: MakeTransport) -> None:
    size, count = 64 * 1024, 40  # 2.5 MiB through a 1 MiB queue
    t = make_transport(TransportSettings(max_queue_bytes=MiB, publish_patience_s=30, prefetch=2))
    q = _local(t, "bp")
    pub = t.publisher()
    done = threading.Event()

    def produce() -> None:
        for i in range(count):
            pub.publish(q, i.to_bytes(4, "big") * (size // 4), f"m{i}")
        done.set()

    producer = threading.Thread(target=produce, daemon=True)
    consumer = t.consume(q, prefetch=2)
    producer.start()
    # The consumer is "computing": takes nothing until the producer has filled the queue to about
    # the cap (however long a loaded machine takes), and a while longer.
    max_depth, full_since = 0, None
    deadline = time.monotonic() + 120
    while full_since is None or time.monotonic() < full_since + 1.0:
        assert time.monotonic() < deadline, f"the queue never filled: {max_depth} messages"
        max_depth = max(max_depth, t.queue_depth(q) or 0)
        if full_since is None and max_depth >= MiB // size - 2:
            full_since = time.monotonic()
        time.sleep(0.1)
    assert not done.is_set(), "producer should be held back by the full queue"
    assert max_depth * size <= MiB

    seen: list[int] = []
    while len(seen) < count:
        d = consumer.get(timeout=10)
        assert d is not None, f"stuck after {len(seen)}"
        seen.append(int.from_bytes(bytes(d.body)[:4], "big"))
        assert d.ack()
    producer.join(timeout=10)
    assert done.is_set()
    assert seen == list(range(count))  # exactly once, in order
    assert pub.stats.waits_full > 0 and pub.stats.published == count  # type: ignore[attr-defined]
    assert consumer.get(timeout=0.3) is None
    consumer.close()
    pub.close()


def test_dead_letter_moves_message_with_reason_and_consumer_continues(
    make_transport: MakeTransport,
) -> None:
    t = make_transport()
    q = _local(t)
    dlq = t.declare_dead_letter_queue()
    with t.publisher() as pub:
        pub.publish(q, b"poison", "bad", headers={"origin": "gen"})
        pub.publish(q, b"fine", "good")
    with t.consume(q) as consumer:
        bad = consumer.get(timeout=5)
        assert bad is not None
        bad.dead_letter("bad_checksum", "crc 1 != 2")
        good = consumer.get(timeout=5)
        assert good is not None and good.message_id == "good"
        assert good.ack()
    assert t.queue_depth(q) == 0
    with t.consume(dlq) as dead:
        d = dead.get(timeout=5)
        assert d is not None and bytes(d.body) == b"poison"
        assert d.headers[base.REASON_HEADER] == "bad_checksum"
        assert d.headers[base.DETAIL_HEADER] == "crc 1 != 2"
        assert d.headers[base.ORIGINAL_QUEUE_HEADER] == q
        assert d.headers[base.MESSAGE_ID_HEADER] == "bad"
        assert d.headers["origin"] == "gen"
        assert d.ack()


def test_dead_letter_without_dlq_keeps_the_message(make_transport: MakeTransport) -> None:
    t = make_transport(TransportSettings(max_queue_bytes=MiB, publish_patience_s=0.3))
    q = _local(t)
    with t.publisher() as pub:
        pub.publish(q, b"poison", "bad")
    consumer = t.consume(q)
    d = consumer.get(timeout=5)
    assert d is not None
    with pytest.raises(TransportError):
        d.dead_letter("malformed")  # no dead-letter queue declared: refused, not lost
    consumer.close()
    with t.consume(q) as again:
        back = again.get(timeout=5)
        assert back is not None and back.message_id == "bad" and back.redelivered
        assert back.ack()


def test_unroutable_publish_gives_up_after_patience(make_transport: MakeTransport) -> None:
    t = make_transport(TransportSettings(max_queue_bytes=MiB, publish_patience_s=0.5))
    with t.publisher() as pub:
        start = time.monotonic()
        with pytest.raises(BackpressureTimeout):
            pub.publish(t.queue_for("g"), b"x", "m0")  # never declared
        assert 0.3 < time.monotonic() - start < 30  # its patience, then it gives up: never waits for ever
        assert pub.stats.waits_unroutable > 0  # type: ignore[attr-defined]


def test_redeclare_with_other_arguments_is_refused(make_transport: MakeTransport) -> None:
    t = make_transport(TransportSettings(max_queue_bytes=MiB))
    _local(t, "dup")
    other = make_transport(TransportSettings(max_queue_bytes=2 * MiB))
    with pytest.raises(TransportError):
        other.declare_flow(Flow("dup", "a", "a"), "producer")


def test_sides_are_checked_against_this_cluster(make_transport: MakeTransport) -> None:
    t = make_transport(cluster="a")
    with pytest.raises(TransportError):
        t.declare_flow(Flow("f", "b", "a"), "producer")  # producers live on b
    with pytest.raises(TransportError):
        t.declare_flow(Flow("f", "a", "b"), "consumer")  # consumers live on b


def test_reply_goes_to_reply_to_with_correlation_id(make_transport: MakeTransport) -> None:
    t = make_transport()
    requests, replies = _local(t, "f"), _local(t, "g")
    with t.publisher() as pub, t.consume(requests) as server, t.consume(replies) as client:
        pub.publish(requests, b"req", "r1", correlation_id="corr-7", reply_to=replies)
        request = server.get(timeout=5)
        assert request is not None and request.reply_to == replies
        pub.publish(request.reply_to, b"answer", "a1", correlation_id=request.correlation_id)
        assert request.ack()
        reply = client.get(timeout=5)
        assert reply is not None
        assert (bytes(reply.body), reply.correlation_id) == (b"answer", "corr-7")
        assert reply.ack()


def test_close_wakes_a_waiting_get(make_transport: MakeTransport) -> None:
    t = make_transport()
    consumer = t.consume(_local(t))
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            consumer.get(timeout=None)
        except TransportError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    time.sleep(0.3)
    consumer.close()
    waiter.join(timeout=5)
    assert not waiter.is_alive() and len(errors) == 1
