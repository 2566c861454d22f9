"""Who put each message into a dead-letter queue, on real broker nodes over TLS (issue 29).

The transport stamps every dead letter with its connection's user (the certificate's CN) as the
AMQP ``user_id``, which the broker checks; ``nebula-mq audit dead-letters`` reads the queue
without draining it and flags each message no consuming role vouches for. Names are unique to
this module (shared stack)."""

from __future__ import annotations

import os

import pika
import pika.exceptions
import pytest

from nebula_mq import topology
from nebula_mq.cli.audit import dead_letter_findings, ensure_dead_letter_auditor
from nebula_mq.security.roles import dead_letter_writers
from nebula_mq.settings import BrokerSettings, TransportSettings
from nebula_mq.transport.base import REASON_HEADER
from nebula_mq.transport.dead_letters import peek_dead_letters
from nebula_mq.transport.rabbit import RabbitTransport
from tests.fixtures.roles import decoder, encoder
from tests.fixtures.stack import StackHandle, pika_parameters

pytest_plugins = ["tests.fixtures.stack"]
pytestmark = pytest.mark.broker

A, B = "cluster-a", "cluster-b"
SETTINGS = TransportSettings(max_queue_bytes=1 << 22, publish_patience_s=10, prefetch=4)


def _publish_by_hand(settings: BrokerSettings, exchange: str, queue: str, message_id: str,
                     user_id: str | None = None) -> None:
    """A confirmed publish into the dead-letter exchange with forged reason headers, not through
    the transport's ``dead_letter``."""
    conn = pika.BlockingConnection(pika_parameters(settings))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2, message_id=message_id, user_id=user_id,
                                     headers={REASON_HEADER: "bad_checksum"})
        ch.basic_publish(exchange, queue, b"forged", props, mandatory=True)
    finally:
        if conn.is_open:
            conn.close()


def test_dead_letters_carry_their_condemner_and_the_audit_flags_the_rest(stack: StackHandle) -> None:
    tag = f"dla{os.getpid()}"
    enc, dec, dec2, inspector = f"{tag}-enc-0", f"{tag}-dec-0", f"{tag}-dec-1", f"{tag}-inspector"
    flows = topology.abnet_flows(A, B, (enc,))
    job = stack.new_job(flows, {A: [encoder(enc)], B: [decoder(dec, [enc]), decoder(dec2, [enc]), inspector]},
                        prefix="dla")
    dlq, dlx, act = topology.dead_letter_queue(job.job_id), topology.dead_letter_exchange(job.job_id), job.queue("activations")
    sender = RabbitTransport(job.settings(A, enc), SETTINGS, job.job_id, A)
    receiver = RabbitTransport(job.settings(B, dec), SETTINGS, job.job_id, B)
    with sender, receiver:
        sender.declare_flow(flows[0], "producer")
        receiver.declare_flow(flows[0], "consumer")
        receiver.declare_dead_letter_queue()
        assert receiver.connection_user() == dec  # EXTERNAL auth: the certificate's CN
        # Condemned by its consumer (the delivery's path) and by the transport's own dead_letter.
        sender.publisher().publish(act, b"not an envelope", f"{tag}-bad")
        consumer = receiver.consume(act, 4)
        delivery = consumer.get(20)
        assert delivery is not None and delivery.message_id == f"{tag}-bad"
        delivery.dead_letter("malformed", "not an envelope")
        consumer.close()
        receiver.dead_letter(b"late", f"{tag}-late", "out_of_window", original_queue=act)
    # A consumer's certificate publishing into the dead-letter exchange by hand: no user_id.
    _publish_by_hand(job.settings(B, dec), dlx, dlq, f"{tag}-forged")
    # Another identity's user_id is refused by the broker (and nothing is queued).
    conn = pika.BlockingConnection(pika_parameters(job.settings(B, dec)))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.basic_publish(dlx, dlq, b"x", pika.BasicProperties(user_id=dec2, message_id=f"{tag}-impostor"))
        assert refused.value.reply_code == 406 and dec2 in str(refused.value.reply_text)
    finally:
        if conn.is_open:
            conn.close()
    # Its own user_id passes the broker, but an identity that is no consuming role is flagged.
    _publish_by_hand(job.settings(B, inspector), dlx, dlq, f"{tag}-inspector", user_id=inspector)

    auditor = ensure_dead_letter_auditor(job.stack, B, job.job_id)
    first = peek_dead_letters(auditor, dlq)
    ids = [letter.message_id for letter in first.letters]
    assert ids == [f"{tag}-bad", f"{tag}-late", f"{tag}-forged", f"{tag}-inspector"] and first.unread == 0
    users = {letter.message_id: letter.user_id for letter in first.letters}
    assert users[f"{tag}-bad"] == users[f"{tag}-late"] == dec and users[f"{tag}-forged"] is None
    assert first.letters[0].reason == "malformed"
    consumers = dead_letter_writers(job.job_id, [decoder(dec, [enc]), decoder(dec2, [enc])], flows)
    findings, read, unread = dead_letter_findings(auditor, job.job_id, B, consumers, None)
    assert (read, unread) == (4, 0)
    flagged = {f.message_id: f for f in findings}
    assert set(flagged) == {f"{tag}-forged", f"{tag}-inspector"}
    assert "no user_id" in flagged[f"{tag}-forged"].line() and "bad_checksum" in flagged[f"{tag}-forged"].line()
    assert "not a consuming role" in flagged[f"{tag}-inspector"].problem
    # With the audit log: a stamped dead letter without a message_dead_lettered record is flagged too.
    findings, _, _ = dead_letter_findings(auditor, job.job_id, B, consumers, frozenset({f"{tag}-bad"}))
    assert {f.message_id for f in findings} == {f"{tag}-late", f"{tag}-forged", f"{tag}-inspector"}
    # Reading took nothing out, in order; a limit leaves the rest counted as unread.
    assert stack.stack.queue_depths(B, job.vhost)[dlq].messages == 4
    again = peek_dead_letters(auditor, dlq, limit=2)
    assert [letter.message_id for letter in again.letters] == ids[:2] and again.unread == 2
    # The auditor reads only: it cannot publish into the dead-letter exchange.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as denied:
        _publish_by_hand(auditor, dlx, dlq, f"{tag}-auditor")
    assert denied.value.reply_code == 403
