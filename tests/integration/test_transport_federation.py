"""Cross-cluster flows over the TLS stack: federation, WAN cuts, consumer crashes.

Uses the session fixture ``stack`` (tests/fixtures/stack.py): two TLS-only
nodes, cluster-a and cluster-b, federated through relays that can cut the WAN,
one fresh job (own vhost, users, upstream, policy) per test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nebula_mq import topology
from nebula_mq.settings import TransportSettings
from nebula_mq.topology import Flow
from nebula_mq.transport.rabbit import RabbitTransport
from tests.fixtures.exactly_once import applied_before_kill_at_m5, apply_once

# The session fixture ``stack`` (a no-op when tests/conftest.py requires it too).
pytest_plugins = ["tests.fixtures.stack"]

pytestmark = pytest.mark.broker

A, B = "cluster-a", "cluster-b"
SETTINGS = TransportSettings(max_queue_bytes=1024 * 1024, publish_patience_s=60, prefetch=4)


class Job:
    """One provisioned job: a flow A -> B, a producer transport on A, a consumer one on B."""

    def __init__(self, stack: Any) -> None:
        self.flow = Flow("x", A, B)
        handle = stack.new_job([self.flow], {A: ["prod-0"], B: ["cons-0"]}, prefix="tf",
                               max_queue_bytes=SETTINGS.max_queue_bytes)
        self.id = handle.job_id
        self.consumer_broker = handle.settings(B, "cons-0")
        self.producer = RabbitTransport(handle.settings(A, "prod-0"), SETTINGS, self.id, A)
        self.consumer = RabbitTransport(self.consumer_broker, SETTINGS, self.id, B)
        self.producer.open()
        self.consumer.open()
        self.queue = self.producer.declare_flow(self.flow, "producer")  # bounded, on A
        self.consumer.declare_flow(self.flow, "consumer")  # uncapped federated copy, on B
        self.consumer.declare_dead_letter_queue()

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()


@pytest.fixture
def job(stack: Any) -> Iterator[Job]:
    j = Job(stack)
    yield j
    j.close()
    stack.clean_wan()


def _drain(consumer: Any, done: set[str], applied: list[str], want: int, timeout: float) -> int:
    """Apply new messages until ``want`` are applied; returns how many repeats were discarded.
    ``done``: the ids applied, the consumer's memory of repeats."""
    discarded = 0
    deadline = time.monotonic() + timeout
    while len(applied) < want:
        assert time.monotonic() < deadline, f"only {len(applied)}/{want} applied"
        d = consumer.get(timeout=1.0)
        if d is not None:
            discarded += apply_once(d, done, applied)
    return discarded


def test_cross_cluster_flow_over_tls_federation(job: Job) -> None:
    with job.producer.publisher() as pub:
        for i in range(20):
            pub.publish(job.queue, b"x%d" % i, f"m{i}", headers={"i": i})
    applied: list[str] = []
    with job.consumer.consume(job.queue) as consumer:
        _drain(consumer, set(), applied, 20, timeout=60)
    assert applied == [f"m{i}" for i in range(20)]


def test_backpressure_crosses_the_wan_without_a_downstream_cap(job: Job) -> None:
    size, count, cap = 64 * 1024, 60, SETTINGS.max_queue_bytes
    consumer = job.consumer.consume(job.queue, prefetch=2)  # stalled: takes nothing yet
    pub = job.producer.publisher()
    produced = threading.Event()

    def produce() -> None:
        for i in range(count):
            pub.publish(job.queue, i.to_bytes(4, "big") * (size // 4), f"m{i}")
        produced.set()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    upstream_max, downstream_max = 0, 0
    # Stalled until the producer is held back (however long a loaded machine takes to fill the
    # queues), and a while longer.
    deadline, held_since = time.monotonic() + 120, None
    while held_since is None or time.monotonic() < held_since + 2.0:
        assert time.monotonic() < deadline, "the producer was never held back across the WAN"
        upstream_max = max(upstream_max, job.producer.queue_depth(job.queue) or 0)
        downstream_max = max(downstream_max, job.consumer.queue_depth(job.queue) or 0)
        if held_since is None and pub.stats.waits_full > 0:
            held_since = time.monotonic()
        time.sleep(0.2)
    print(f"stalled: upstream max {upstream_max} msgs, downstream max {downstream_max}, "
          f"publisher waits {pub.stats.waits_full}")
    assert not produced.is_set(), "the producer should be held back across the WAN"
    assert upstream_max * size <= cap
    assert downstream_max < count - cap // size  # the downstream copy did not take it all
    seen: list[int] = []
    done: set[str] = set()
    while len(seen) < count:
        d = consumer.get(timeout=30)
        assert d is not None, f"stuck after {len(seen)}"
        if d.message_id not in done:
            done.add(d.message_id)
            seen.append(int.from_bytes(bytes(d.body)[:4], "big"))
        assert d.ack()
    producer.join(timeout=30)
    assert produced.is_set()
    assert sorted(seen) == list(range(count))
    consumer.close()
    pub.close()


def test_exactly_once_across_a_wan_cut(job: Job, stack: Any) -> None:
    wan = stack.stack
    done: set[str] = set()
    applied: list[str] = []
    consumer = job.consumer.consume(job.queue)
    pub = job.producer.publisher()
    for i in range(10):
        pub.publish(job.queue, b"x", f"m{i}")
    _drain(consumer, done, applied, 10, timeout=60)

    wan.cut()
    for i in range(10, 30):  # the local broker takes them: the sender never notices the cut
        pub.publish(job.queue, b"x", f"m{i}")
    time.sleep(2)
    depth = job.producer.queue_depth(job.queue)
    assert depth is not None and depth > 0  # held on the sending side during the outage
    wan.heal()
    _drain(consumer, done, applied, 30, timeout=120)
    assert sorted(applied, key=lambda m: int(m[1:])) == [f"m{i}" for i in range(30)]
    assert len(applied) == len(set(applied))
    assert consumer.get(timeout=2.0) is None
    consumer.close()
    pub.close()


def test_exactly_once_across_kill_9_of_the_consumer(job: Job, tmp_path: Path) -> None:
    with job.producer.publisher() as pub:
        for i in range(12):
            pub.publish(job.queue, b"x", f"m{i}")
    applied = applied_before_kill_at_m5(job.id, "cluster-b", job.queue, job.consumer_broker, tmp_path)
    with job.consumer.consume(job.queue) as consumer:
        discarded = _drain(consumer, set(applied), applied, 12, timeout=60)
        assert consumer.get(timeout=1.0) is None
    assert discarded >= 1  # m5 came back and was recognised
    assert applied == [f"m{i}" for i in range(12)]
    assert topology.queue_name(job.id, "x") == job.queue
