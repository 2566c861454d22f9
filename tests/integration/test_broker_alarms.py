"""Resource alarms on real RabbitMQ nodes over TLS: publishers wait them out, nothing is lost.

A private two-node federated stack (``running_stack``: an alarm on the shared session stack
would block every test that runs beside this one). The blocked-connection timeout of the
connections that do not wait alarms out is lowered to 1 s, so holding an alarm for a few seconds
shows what an hour would: a publisher still on its first connection, waiting, not failing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from nebula_mq.errors import StopDuringAlarm
from nebula_mq.settings import TransportSettings
from nebula_mq.stack import Stack
from nebula_mq.topology import Flow
from nebula_mq.transport import connection
from nebula_mq.transport.rabbit import RabbitTransport
from tests.fixtures.stack import CLUSTERS, running_stack

pytestmark = pytest.mark.broker

A, B = CLUSTERS
# Short patience: an alarm held longer than this still fails no publish (it does not count).
SETTINGS = TransportSettings(max_queue_bytes=4 * 1024 * 1024, publish_patience_s=2.5, prefetch=16,
                             publish_window=4)
HOLD_S = 3.0  # > the patience, and 3x the lowered blocked-connection timeout
# (turn the alarm on, turn it off) per kind; "{limit}" is the disk limit the node had.
ALARMS = {
    "memory": (("set_vm_memory_high_watermark", "0.0000001"), ("set_vm_memory_high_watermark", "0.4")),
    "disk": (("set_disk_free_limit", "100000GB"), ("set_disk_free_limit", "{limit}")),
}


@dataclass
class Job:
    stack: Stack
    producer: RabbitTransport  # on A
    consumer: RabbitTransport  # on B
    queue: str
    disk_limit: str
    reported: list[tuple[str, str | None]] = field(default_factory=list)  # (cluster, reason) from A's alarm

    def alarm(self, cluster: str, kind: str, on: bool) -> None:
        args = ALARMS[kind][0 if on else 1]
        # rabbitmqctl boots an Erlang VM of its own: 20 s were too few once, with both lanes
        # starting brokers on 2 cores; a node that is really gone still fails within a minute.
        self.stack.rabbitmqctl(cluster, *(a.format(limit=self.disk_limit) for a in args), timeout=60)


@pytest.fixture(scope="module")
def job() -> Iterator[Job]:
    with running_stack(CLUSTERS, "nal") as handle:
        flow = Flow("x", A, B)
        jh = handle.new_job([flow], {A: ["prod-0"], B: ["cons-0"]}, prefix="al",
                            max_queue_bytes=SETTINGS.max_queue_bytes)
        producer = RabbitTransport(jh.settings(A, "prod-0"), SETTINGS, jh.job_id, A)
        consumer = RabbitTransport(jh.settings(B, "cons-0"), SETTINGS, jh.job_id, B)
        producer.open()
        consumer.open()
        queue = producer.declare_flow(flow, "producer")
        consumer.declare_flow(flow, "consumer")
        consumer.declare_dead_letter_queue()
        limit = handle.stack.rabbitmqctl(A, "eval", "rabbit_disk_monitor:get_disk_free_limit().").strip()
        j = Job(handle.stack, producer, consumer, queue, limit)
        producer.alarm.subscribe(lambda reason: j.reported.append((producer.alarm.where, reason)))
        try:
            yield j  # (each test clears the alarms it sets, and the stack goes with the module)
        finally:
            producer.close()
            consumer.close()


@pytest.fixture(autouse=True)
def short_blocked_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "BLOCKED_CONNECTION_TIMEOUT_S", 1.0)


def _until(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)


def _drain(job: Job, want: set[str], timeout: float = 20.0, repeats: bool = False) -> list[str]:
    """Message ids from B's copy, each acked, until every one of ``want`` arrived; then none more
    (with ``repeats``: those that come within a second more, each a copy of one of ``want``)."""
    got: list[str] = []
    with job.consumer.consume(job.queue, prefetch=16) as consumer:
        deadline = time.monotonic() + timeout
        while not want <= set(got):
            assert time.monotonic() < deadline, f"missing after {timeout} s: {sorted(want - set(got))}"
            d = consumer.get(timeout=0.5)
            if d is not None:
                got.append(d.message_id)
                assert d.ack()
        while (d := consumer.get(timeout=1.0)) is not None:
            assert repeats and d.message_id in want, f"a message arrived twice: {d.message_id}"
            got.append(d.message_id)
            assert d.ack()
    return got


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_a_publisher_waits_out_an_alarm_on_its_broker_and_nothing_is_lost(job: Job, kind: str) -> None:
    ids = [f"{kind}-{i}" for i in range(12)]
    pub = job.producer.publisher()
    errors: list[BaseException] = []
    done = threading.Event()

    def produce() -> None:
        try:
            for mid in ids:
                pub.publish_async(job.queue, mid.encode() * 100, mid)
            pub.flush()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)
        done.set()

    job.reported.clear()
    job.alarm(A, kind, on=True)
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        _until("the broker blocks the publisher", lambda: job.producer.alarm.active)
        time.sleep(HOLD_S)
        # HOLD_S is past the publisher's patience: a wait that counted blocked time would have failed.
        assert not done.is_set() and not errors, "the publisher waits past its patience while the alarm lasts"
        assert pub.in_flight > 0 and pub.reconnects == 0, "on its first connection, never dropped"
        assert job.reported == [(A, "low on memory" if kind == "memory" else "low on disk")]
    finally:
        job.alarm(A, kind, on=False)
    assert done.wait(20), "the publisher goes on once the alarm clears"
    assert not errors, errors
    assert job.reported[-1] == (A, None) and not job.producer.alarm.active
    assert pub.reconnects == 0 and pub.stats.published == len(ids)
    got = _drain(job, set(ids))
    assert sorted(got) == sorted(ids), "each message once"
    pub.close()


def test_a_stop_during_an_alarm_ends_the_wait_and_the_messages_go_again(job: Job) -> None:
    stop = threading.Event()
    job.producer.alarm.stop_when(stop.is_set)
    pub = job.producer.publisher()
    job.alarm(A, "memory", on=True)
    try:
        for i in range(3):
            pub.publish_async(job.queue, b"s", f"stop-{i}")
        _until("the broker blocks the publisher", lambda: job.producer.alarm.active)
        stop.set()
        started = time.monotonic()
        with pytest.raises(StopDuringAlarm):
            pub.flush()
        pub.close()  # does not wait for the close-ok a blocked connection never gets
        assert time.monotonic() - started < 20.0  # a bound: waiting, it would wait until the alarm ends
    finally:
        job.producer.alarm.stop_when(lambda: False)
        job.alarm(A, "memory", on=False)
    # A restarted worker sends what no checkpoint covered again, under the same ids.
    again = job.producer.publisher()
    for i in range(3):
        again.publish(job.queue, b"s", f"stop-{i}")
    # The first copies, read by the broker once the alarm cleared, may arrive too: deduped by id.
    got = _drain(job, {f"stop-{i}" for i in range(3)}, repeats=True)
    assert set(got) == {f"stop-{i}" for i in range(3)}
    again.close()


def test_federation_delivers_into_a_downstream_broker_in_alarm(job: Job) -> None:
    """Measured on 3.10.8: the link ignores the downstream alarm, while B's own publishers block."""
    b_pub = job.consumer.publisher()
    job.alarm(B, "disk", on=True)
    try:
        b_pub.publish_async(job.consumer.dead_letter_queue, b"probe", "b-probe")
        _until("B blocks its own publishers", lambda: job.consumer.alarm.active)
        ids = [f"fed-{i}" for i in range(10)]
        with job.producer.publisher() as pub:
            for mid in ids:
                pub.publish(job.queue, b"f", mid)
        got = _drain(job, set(ids), timeout=15)
        assert sorted(got) == sorted(ids)
        assert job.consumer.alarm.active, "delivered while B was still in alarm"
    finally:
        job.alarm(B, "disk", on=False)
    b_pub.flush(timeout=15)
    b_pub.close()
