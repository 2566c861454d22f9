"""Queue federation between the stack's nodes, over TLS, through the emulated WAN."""

from __future__ import annotations

import json
import re
import time

import pika
import pytest

from nebula_mq import topology
from nebula_mq.transport.declare import federated_copy_arguments

from tests.fixtures.stack import JobHandle, StackHandle, pika_parameters

pytestmark = pytest.mark.broker


def _publish(job: JobHandle, cluster: str, queue: str, ids: list[str]) -> None:
    conn = pika.BlockingConnection(pika_parameters(job.settings(cluster)))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True, arguments=federated_copy_arguments())
        for mid in ids:
            ch.basic_publish("", queue, mid.encode(), pika.BasicProperties(delivery_mode=2, message_id=mid))
    finally:
        conn.close()


def _consume(job: JobHandle, cluster: str, queue: str, want: int, timeout: float) -> list[str]:
    """Consume (and ack) until ``want`` messages arrived or ``timeout`` passed."""
    got: list[str] = []
    conn = pika.BlockingConnection(pika_parameters(job.settings(cluster)))
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments=federated_copy_arguments())
        ch.basic_qos(prefetch_count=16)
        deadline = time.monotonic() + timeout
        for method, props, body in ch.consume(queue, inactivity_timeout=0.2):
            if method is not None:
                got.append(props.message_id)
                ch.basic_ack(method.delivery_tag)
            if len(got) >= want or time.monotonic() > deadline:
                break
        ch.cancel()
    finally:
        conn.close()
    return got


def _policies(stack: StackHandle, cluster: str, vhost: str) -> list[dict]:
    out = stack.stack.rabbitmqctl(cluster, "list_policies", "-p", vhost, "--formatter", "json", "--quiet")
    return json.loads(out)


def test_policy_federates_only_flows_into_each_cluster(stack: StackHandle) -> None:
    job = stack.new_job()
    queues = [job.queue(f.name) for f in job.flows]
    federated, capped = {}, {}
    for cluster in ("cluster-a", "cluster-b"):
        policies = {p["name"]: p for p in _policies(stack, cluster, job.vhost)}
        policy = policies[topology.federation_policy(job.job_id)]
        federated[cluster] = ({q for q in queues if re.match(policy["pattern"], q)},
                              json.loads(policy["definition"])["federation-upstream"])
        cap = policies[topology.cap_policy(job.job_id)]
        capped[cluster] = {q for q in queues if re.match(cap["pattern"], q)}
        assert json.loads(cap["definition"])["overflow"] == "reject-publish"
    # activations flow A -> B: federated on B only, from A; the reply flow B -> A: on A only, from B.
    assert federated["cluster-b"] == ({job.queue("activations")}, "nebula-upstream-cluster-a")
    assert federated["cluster-a"] == ({job.queue("reply-enc-0")}, "nebula-upstream-cluster-b")
    # ...and each flow is capped on its sending side only (never downstream of the link).
    assert capped == {"cluster-a": {job.queue("activations")}, "cluster-b": {job.queue("reply-enc-0")}}


def test_message_crosses_federation_over_tls(stack: StackHandle) -> None:
    job = stack.new_job()
    q = job.queue("activations")
    ids = [f"m{i}" for i in range(20)]
    _publish(job, "cluster-a", q, ids)
    assert stack.stack.queue_depths("cluster-a", job.vhost)[q].messages == 20
    got = _consume(job, "cluster-b", q, want=len(ids), timeout=30)
    assert sorted(set(got)) == sorted(ids)
    assert stack.stack.queue_depths("cluster-a", job.vhost)[q].messages == 0


def test_wan_cut_blocks_delivery_and_heal_resumes_it(stack: StackHandle) -> None:
    job = stack.new_job()
    q = job.queue("activations")
    _publish(job, "cluster-a", q, ["warm-up"])
    assert _consume(job, "cluster-b", q, want=1, timeout=30) == ["warm-up"]
    try:
        stack.stack.cut("cluster-a")
        ids = [f"c{i}" for i in range(5)]
        _publish(job, "cluster-a", q, ids)
        assert _consume(job, "cluster-b", q, want=1, timeout=4) == []
        assert stack.stack.queue_depths("cluster-a", job.vhost)[q].messages == 5
        status = stack.stack.wan_status()["to-cluster-a"]
        assert status["shape"]["cut"] is True and status["connections"] == 0
    finally:
        stack.clean_wan()
    got = _consume(job, "cluster-b", q, want=5, timeout=30)
    assert sorted(set(got)) == sorted(ids)


def test_federation_link_survives_a_downstream_node_restart(stack: StackHandle) -> None:
    job = stack.new_job()
    q = job.queue("activations")
    _publish(job, "cluster-a", q, ["before"])
    assert _consume(job, "cluster-b", q, want=1, timeout=30) == ["before"]
    stack.stack.restart_node("cluster-b")
    assert stack.stack.status()["cluster-b"].running
    ids = [f"r{i}" for i in range(5)]
    _publish(job, "cluster-a", q, ids)
    got = _consume(job, "cluster-b", q, want=5, timeout=30)
    assert sorted(set(got)) == sorted(ids)


@pytest.mark.slow
def test_federation_goodput_with_4mb_messages_reaches_the_shaped_rate(stack: StackHandle) -> None:
    rate, size, n = 60.0, 4 * 1024 * 1024, 8
    job = stack.new_job()
    q = job.queue("activations")
    try:
        stack.stack.shape(None, rate_mbit=rate, delay_ms=20)
        conn = pika.BlockingConnection(pika_parameters(job.settings("cluster-a")))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(q, durable=True, arguments=federated_copy_arguments())
        for i in range(n):
            ch.basic_publish("", q, bytes([i]) * size, pika.BasicProperties(delivery_mode=2, message_id=str(i)))
        conn.close()
        arrivals = []
        conn = pika.BlockingConnection(pika_parameters(job.settings("cluster-b")))
        ch = conn.channel()
        ch.queue_declare(q, durable=True, arguments=federated_copy_arguments())
        ch.basic_qos(prefetch_count=4)
        for method, _props, body in ch.consume(q, inactivity_timeout=30):
            assert method is not None, "federation stalled"
            assert len(body) == size
            arrivals.append(time.monotonic())
            ch.basic_ack(method.delivery_tag)
            if len(arrivals) == n:
                break
        conn.close()
    finally:
        stack.clean_wan()
    # Steady state: n-1 messages between the first and the last arrival.
    goodput = (n - 1) * size * 8 / (arrivals[-1] - arrivals[0]) / 1e6
    print(f"federation goodput {goodput:.1f} Mbit/s at a {rate} Mbit/s cap")
    # The cap holds (the shaper is the link), and the floor catches federation falling far
    # behind it. Loaded 2-core CI hosts measured 0.79-0.89 of the cap, so how close it comes is
    # `bench transport`'s figure, not this test's.
    assert 0.6 * rate <= goodput <= 1.1 * rate
