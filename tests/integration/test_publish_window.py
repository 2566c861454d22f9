"""Windowed publisher confirms on real RabbitMQ: the window holds, nacked and returned messages are
sent again, and a broker restart with confirms outstanding loses nothing and applies nothing twice."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from nebula_mq.errors import TransportError
from nebula_mq.settings import BrokerSettings, TransportSettings
from nebula_mq.topology import Flow
from nebula_mq.transport.base import PublishHandle
from nebula_mq.transport.rabbit import RabbitTransport
from tests.fixtures.exactly_once import apply_once
from tests.fixtures.stack import StackHandle

pytestmark = pytest.mark.broker

DEFAULT_NODE = BrokerSettings(host="127.0.0.1", port=5672, tls=False, heartbeat_s=10)
MiB = 1024 * 1024


@pytest.fixture
def transport() -> Iterator[RabbitTransport]:
    t = RabbitTransport(DEFAULT_NODE, TransportSettings(max_queue_bytes=MiB, publish_patience_s=30, publish_window=8),
                        f"w-{uuid.uuid4().hex[:10]}", "a")
    t.open()
    yield t
    t.close()
    for flow in ("f", "late"):
        t.delete_queue(t.queue_for(flow))


def _drain(t: RabbitTransport, queue: str, want: int, timeout: float = 30.0) -> list[str]:
    """Message ids in arrival order, each acked, until ``want`` arrived (fails on a stall)."""
    got: list[str] = []
    with t.consume(queue, prefetch=16) as consumer:
        deadline = time.monotonic() + timeout
        while len(got) < want:
            assert time.monotonic() < deadline, f"only {len(got)} of {want} arrived"
            d = consumer.get(timeout=1)
            if d is not None:
                got.append(d.message_id)
                assert d.ack()
        assert consumer.get(timeout=0.5) is None, "a message arrived twice"
    return got


def _until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait until ``condition()``: as long as a loaded machine takes, failing at ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_window_bounds_what_is_in_flight_and_flush_returns_once_all_are_held(transport: RabbitTransport) -> None:
    q = transport.declare_flow(Flow("f", "a", "a"), "producer")
    pub = transport.publisher()
    ids = [f"m{i}" for i in range(200)]
    handles = [pub.publish_async(q, b"x" * 1024, mid) for mid in ids]
    pub.flush(timeout=30)
    assert all(h.done() for h in handles)
    assert 1 < pub.max_in_flight <= 8, "several outstanding, never more than the window"
    assert pub.in_flight == 0 and pub.stats.published == 200
    assert transport.queue_depth(q) == 200  # the broker holds every one once flush returned
    assert _drain(transport, q, 200) == ids  # nothing failed: submission order is kept


def test_nacked_publishes_are_sent_again_until_the_queue_has_room_and_none_is_lost_or_doubled(
        transport: RabbitTransport) -> None:
    q = transport.declare_flow(Flow("f", "a", "a"), "producer")  # capped at 1 MiB, reject-publish
    pub = transport.publisher()
    size, count = 256 * 1024, 12  # 3 MiB through a 1 MiB queue, 8 in flight
    handles = [pub.publish_async(q, i.to_bytes(4, "big") * (size // 4), f"m{i}") for i in range(count)]
    # The consumer is "computing": the queue fills, the broker nacks the rest.
    _until(lambda: pub.stats.waits_full > 0, "the broker never refused a publish to the full queue")
    assert transport.queue_depth(q) * size <= MiB  # type: ignore[operator]
    assert pub.in_flight > 0
    got = _drain(transport, q, count)
    pub.flush(timeout=30)
    assert all(h.done() for h in handles)
    assert sorted(got, key=lambda m: int(m[1:])) == [f"m{i}" for i in range(count)]  # each once
    assert pub.stats.published == count


def test_returned_publishes_are_sent_again_once_the_queue_exists(transport: RabbitTransport) -> None:
    flow = Flow("late", "a", "a")
    q = transport.queue_for(flow)
    pub = transport.publisher()
    handle = pub.publish_async(q, b"early", "early-1")
    _until(lambda: pub.stats.waits_unroutable > 0, "the publish never came back unroutable")
    assert not handle.done()  # mandatory: returned, not dropped
    transport.declare_flow(flow, "producer")
    handle.wait(timeout=15)
    assert _drain(transport, q, 1) == ["early-1"]


def test_the_transports_wait_checks_end_its_publishers_waits_on_their_thread(transport: RabbitTransport) -> None:
    """What a worker adds to ``transport.wait_checks`` (its inbox's watch for a wiped broker) ends
    a wait for room and a wait for confirms of the transport's publishers, on its own thread."""
    pub = transport.publisher()
    q = transport.queue_for("late")  # not declared: every publish comes back and waits (mandatory)
    handles = [pub.publish_async(q, b"x", f"held-{i}") for i in range(8)]  # the window is full

    class Ended(Exception):
        pass

    def check() -> None:
        raise Ended

    remove = transport.wait_checks.add(check)
    try:
        with pytest.raises(Ended):
            pub.flush(timeout=10)  # waits for confirms
        with pytest.raises(Ended):
            pub.publish_async(q, b"x", "held-8")  # waits for room
        outside: list[BaseException] = []
        thread = threading.Thread(target=lambda: _wait_quietly(handles[0], outside))
        thread.start()
        thread.join(10)
        assert outside and isinstance(outside[0], TransportError)  # its own deadline, not the check
    finally:
        remove()
    transport.declare_flow(Flow("late", "a", "a"), "producer")
    pub.flush(timeout=15)  # removed: the held messages go once the queue exists
    assert sorted(_drain(transport, q, 8)) == sorted(f"held-{i}" for i in range(8))


def _wait_quietly(handle: PublishHandle, out: list[BaseException]) -> None:
    try:
        handle.wait(timeout=1.0)
    except BaseException as exc:  # noqa: BLE001 (collected for the assert)
        out.append(exc)


def test_a_publish_whose_patience_runs_out_fails_its_handle_and_frees_the_window() -> None:
    t = RabbitTransport(DEFAULT_NODE, TransportSettings(publish_patience_s=0.5, publish_window=2),
                        f"w-{uuid.uuid4().hex[:10]}", "a")
    try:
        pub = t.publisher()
        handles = [pub.publish_async(t.queue_for("nowhere"), b"x", f"m{i}") for i in range(4)]
        for h in handles:
            with pytest.raises(TransportError, match="not accepted within 0.5 s"):
                h.wait(timeout=15)
        assert pub.in_flight == 0
    finally:
        t.close()


@pytest.mark.slow
def test_a_broker_restart_with_confirms_outstanding_loses_nothing_and_applies_each_once(stack: StackHandle) -> None:
    """The producer's broker restarts while the publisher has a window of unconfirmed messages.
    Every handle still resolves (the unconfirmed are sent again on the new connection), and the
    consumer on the other cluster, deduplicating by message id, applies each message once. The
    producer publishes until the node is back, however long its graceful stop takes (once more
    than the whole stream took, and the publisher never had to reconnect)."""
    job = stack.new_job()
    flow = next(f for f in job.flows if f.name == "activations")
    settings = TransportSettings(publish_patience_s=120, publish_window=16)
    src = RabbitTransport(job.settings(flow.src_cluster), settings, job.job_id, flow.src_cluster)
    dst = RabbitTransport(job.settings(flow.dst_cluster), settings, job.job_id, flow.dst_cluster)
    q = src.declare_flow(flow, "producer")
    dst.declare_flow(flow, "consumer")
    count, size = 400, 16 * 1024
    ids: list[str] = []
    pub = src.publisher()
    handles: list = []
    failures: list[BaseException] = []
    restarted = threading.Event()

    def produce() -> None:
        try:
            i = 0
            while i < count or not restarted.is_set():  # a steady stream that spans the restart
                ids.append(f"m{i}")
                handles.append(pub.publish_async(q, i.to_bytes(4, "big") * (size // 4), ids[-1]))
                i += 1
                time.sleep(0.01)
            pub.flush(timeout=120)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    producer = threading.Thread(target=produce, daemon=True)
    applied: list[str] = []
    done: set[str] = set()  # the ids applied: the consumer's memory of repeats
    duplicates = 0
    try:
        producer.start()
        while len(handles) < 60:
            time.sleep(0.05)
        stack.stack.restart_node(flow.src_cluster)
        restarted.set()
        with dst.consume(q, prefetch=32) as consumer:
            deadline = time.monotonic() + 120
            while (producer.is_alive() or len(applied) < len(ids)) and not failures:
                assert time.monotonic() < deadline, f"only {len(applied)} of {len(ids)} applied"
                d = consumer.get(timeout=1)
                if d is not None:
                    duplicates += apply_once(d, done, applied)
            producer.join(timeout=120)
            assert not producer.is_alive() and not failures, failures
            # Anything still on its way would be a repeat: it may come, it is never applied.
            while (d := consumer.get(timeout=2)) is not None:
                assert d.message_id in done
                duplicates += 1
                assert d.ack()
    finally:
        src.close()
        dst.close()
    assert sorted(applied) == sorted(ids)  # nothing lost, nothing applied twice
    assert all(h.done() for h in handles)
    assert pub.reconnects >= 1  # the restart did cut the publisher's connection
    assert pub.stats.published == len(ids) >= count  # each handle confirmed once, resends included
