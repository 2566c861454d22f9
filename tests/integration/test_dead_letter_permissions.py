"""Who may publish into a cluster's dead-letter queue, on real broker nodes over TLS (issue 29).

A consumer condemns a message itself (the transport republishes it to the dead-letter
exchange with its reason, then acks), so a role that consumes keeps write on that
exchange; a role that only publishes has none, and nobody may reach the dead-letter
queue through the default exchange. Names are unique to this module (shared stack)."""

from __future__ import annotations

import os

import pika
import pytest

from nebula_mq import topology
from nebula_mq.errors import AccessRefused, WireError
from nebula_mq.security.roles import WorkerIdentity
from nebula_mq.settings import TransportSettings
from nebula_mq.transport.base import REASON_HEADER
from nebula_mq.transport.rabbit import RabbitTransport
from nebula_mq.wire import decode_envelope
from tests.fixtures.roles import decoder, encoder
from tests.fixtures.stack import StackHandle, pika_parameters, publish_refused

pytest_plugins = ["tests.fixtures.stack"]
pytestmark = pytest.mark.broker

A, B = "cluster-a", "cluster-b"
SETTINGS = TransportSettings(max_queue_bytes=1 << 22, publish_patience_s=10, prefetch=4)



def test_only_a_consumer_may_dead_letter_and_a_malformed_message_still_is(stack: StackHandle) -> None:
    tag = f"dlp{os.getpid()}"
    enc, dec, pub, inspector = f"{tag}-enc-0", f"{tag}-dec-0", f"{tag}-pub-0", f"{tag}-inspector"
    flows = topology.abnet_flows(A, B, (enc,))
    job = stack.new_job(flows, {A: [encoder(enc), WorkerIdentity(pub, publishes=("activations",))],
                                B: [decoder(dec, [enc]), inspector]}, prefix="dlp")
    dlq, dlx, act = topology.dead_letter_queue(job.job_id), topology.dead_letter_exchange(job.job_id), job.queue("activations")
    sender = RabbitTransport(job.settings(A, enc), SETTINGS, job.job_id, A)
    receiver = RabbitTransport(job.settings(B, dec), SETTINGS, job.job_id, B)
    publisher = RabbitTransport(job.settings(A, pub), SETTINGS, job.job_id, A)
    with sender, receiver, publisher:
        sender.declare_flow(flows[0], "producer")
        sender.declare_dead_letter_queue()
        receiver.declare_flow(flows[0], "consumer")
        receiver.declare_dead_letter_queue()
        # A malformed message is condemned by its consumer, with the reason, into B's dead-letter queue.
        sender.publisher().publish(act, b"not an envelope", f"{tag}-bad")
        consumer = receiver.consume(act, 4)
        delivery = consumer.get(20)
        assert delivery is not None and delivery.message_id == f"{tag}-bad"
        with pytest.raises(WireError) as bad:
            decode_envelope(delivery.body, max_bytes=1 << 20)
        delivery.dead_letter(bad.value.reason, str(bad.value))
        consumer.close()
        # A role that only publishes may not: through the transport, or by hand through the
        # dead-letter exchange or the default exchange.
        with pytest.raises(AccessRefused, match="403"):
            publisher.dead_letter(b"forged", f"{tag}-forged", "bad_tag", original_queue=act)
    assert dlx in publish_refused(job.settings(A, pub), dlx, dlq)
    assert "amq.default" in publish_refused(job.settings(A, pub), "", dlq)
    # A consumer's right is the dead-letter exchange only, never the default exchange.
    assert "amq.default" in publish_refused(job.settings(B, dec), "", dlq)
    assert stack.stack.queue_depths(A, job.vhost)[dlq].messages == 0
    conn = pika.BlockingConnection(pika_parameters(job.settings(B, inspector)))
    try:
        method, props, body = conn.channel().basic_get(dlq, auto_ack=True)
    finally:
        conn.close()
    assert method is not None and body == b"not an envelope" and method.message_count == 0
    assert props.headers[REASON_HEADER] == bad.value.reason
