"""The stack's nodes accept only TLS >= 1.2 with a client certificate from a trusted CA."""

from __future__ import annotations

import socket
import ssl

import pika
import pika.exceptions
import pytest

from nebula_mq.security.certs import ClusterCA
from nebula_mq.transport.declare import federated_copy_arguments
from tests.fixtures.stack import StackHandle, pika_parameters, tls_context

pytestmark = pytest.mark.broker

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


def _open_channel(params: object) -> None:
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.queue_declare("nebula.probe", passive=False, durable=False, auto_delete=True)
    finally:
        conn.close()


def test_plaintext_amqp_gets_no_amqp_reply(stack: StackHandle) -> None:
    port = stack.stack.layout.node("cluster-a").tls_port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(AMQP_HEADER)
        reply = s.recv(64)
    # A plaintext AMQP client gets either a closed socket or a TLS alert record (0x15),
    # never the server's connection.start frame (type 1) nor a protocol header.
    assert reply == b"" or reply[0] == 0x15
    plain = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, socket_timeout=5)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(plain)


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_1_1_is_refused(stack: StackHandle) -> None:
    settings = stack.broker_settings("cluster-a", "worker-cluster-a")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(settings.ca_file)
    ctx.load_cert_chain(settings.cert_file, settings.key_file)
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    ctx.minimum_version = ssl.TLSVersion.TLSv1_1
    ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    with socket.create_connection(("127.0.0.1", settings.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLError) as err:
            ctx.wrap_socket(raw, server_hostname="localhost")
    # This client can speak TLS 1.1 (SECLEVEL=0); the broker answers with a protocol_version alert.
    assert "ALERT_PROTOCOL_VERSION" in str(err.value).upper()


def test_client_without_certificate_is_refused(stack: StackHandle) -> None:
    job = stack.new_job()
    settings = job.settings("cluster-a")
    ctx = ssl.create_default_context(cafile=settings.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        _open_channel(pika_parameters(settings, ctx))


def test_certificate_from_another_ca_is_refused(stack: StackHandle, tmp_path) -> None:
    job = stack.new_job()
    good = job.settings("cluster-a")
    # Same CN as a real user of the job, issued by a CA the broker does not trust.
    rogue = ClusterCA(tmp_path, "cluster-a").ensure_client("worker-cluster-a")
    ctx = ssl.create_default_context(cafile=good.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(rogue.cert_file), str(rogue.key_file))
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        _open_channel(pika_parameters(good, ctx))


def test_tls_1_2_with_a_good_certificate_is_accepted(stack: StackHandle) -> None:
    job = stack.new_job()
    settings = job.settings("cluster-a")
    ctx = tls_context(settings)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(("127.0.0.1", settings.port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            assert tls.version() == "TLSv1.2"
    conn = pika.BlockingConnection(pika_parameters(settings, ctx))
    try:
        ch = conn.channel()
        q = job.queue("activations")
        ch.queue_declare(q, durable=True, arguments=federated_copy_arguments())
        ch.basic_publish("", q, b"hello", pika.BasicProperties(delivery_mode=2))
        method, _props, body = ch.basic_get(q, auto_ack=True)
        assert body == b"hello"
    finally:
        conn.close()


def test_worker_is_limited_to_its_jobs_queues(stack: StackHandle) -> None:
    job = stack.new_job()
    conn = pika.BlockingConnection(pika_parameters(job.settings("cluster-a")))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            conn.channel().queue_declare("not-a-job-queue", durable=True)
        assert err.value.reply_code == 403
    finally:
        conn.close()
