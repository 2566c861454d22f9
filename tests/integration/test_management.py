"""The management plugin on the stack's nodes: HTTPS only, loopback only, mutual TLS, and a
read-only monitoring user per job; workers read queue sizes in bytes through it."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from nebula_mq import topology
from nebula_mq.errors import TransportError
from nebula_mq.settings import TransportSettings
from nebula_mq.topology import Flow
from nebula_mq.transport.management import ManagementClient
from nebula_mq.transport.rabbit import RabbitTransport
from tests.fixtures.stack import StackHandle, tls_context

pytestmark = pytest.mark.broker

A, B = "cluster-a", "cluster-b"
SETTINGS = TransportSettings(max_queue_bytes=1024 * 1024, publish_patience_s=30)


def _request(stack: StackHandle, method: str, path: str, settings: Any, auth: str = "") -> tuple[int, bytes]:
    """One raw HTTPS request to cluster-a's management listener, with ``settings``' certificate."""
    import http.client

    port = stack.stack.layout.node(A).mgmt_port
    conn = http.client.HTTPSConnection("localhost", port, context=tls_context(settings), timeout=10)
    headers = {"content-type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    try:
        conn.request(method, path, body=b"{}" if method == "PUT" else None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _auth(settings: Any) -> str:
    import base64

    password = open(settings.management_password_file).read().strip()
    return "Basic " + base64.b64encode(f"{settings.management_user}:{password}".encode()).decode()


def test_workers_of_a_provisioned_job_read_queue_bytes_as_its_monitoring_user(stack: StackHandle) -> None:
    flow = Flow("m", A, A)
    job = stack.new_job([flow], {A: ["prod-0"], B: ["cons-0"]}, prefix="mg",
                        max_queue_bytes=SETTINGS.max_queue_bytes)
    broker = job.settings(A, "prod-0")
    assert broker.management_port == stack.stack.layout.node(A).mgmt_port
    assert broker.management_user == topology.monitoring_user(job.job_id)
    with RabbitTransport(broker, SETTINGS, job.job_id, A) as t:
        queue = t.declare_flow(flow, "producer")
        with t.publisher() as pub:
            for i in range(5):
                pub.publish(queue, bytes(1000 + i), f"m{i}")
        assert t.queue_depth(queue) == 5
        # The plugin refreshes queue statistics every 5 s by default.
        deadline = time.monotonic() + 20
        while t.queue_bytes(queue) != 5 * 1000 + 10:
            assert time.monotonic() < deadline, f"queue_bytes stayed {t.queue_bytes(queue)}"
            time.sleep(0.5)
        assert t.queue_bytes("nebula.no-such-queue") is None


def test_the_monitoring_user_sees_its_job_only_and_changes_nothing(stack: StackHandle) -> None:
    mine = stack.new_job(prefix="mg")
    other = stack.new_job(prefix="mg")
    settings = mine.settings(A)
    auth = _auth(settings)
    status, body = _request(stack, "GET", "/api/vhosts", settings, auth)
    assert status == 200 and mine.vhost.encode() in body and other.vhost.encode() not in body
    q = mine.queue("activations")
    assert ManagementClient(settings).queue(q) is not None
    status, _ = _request(stack, "GET", f"/api/queues/{other.vhost}", settings, auth)
    assert status == 401
    for method, path in (("PUT", f"/api/queues/{mine.vhost}/intruder"), ("DELETE", f"/api/queues/{mine.vhost}/{q}"),
                         ("PUT", "/api/users/intruder"), ("PUT", "/api/vhosts/intruder")):
        status, _ = _request(stack, method, path, settings, auth)
        assert status in (401, 403), f"{method} {path} answered {status}"
    # And a wrong password is refused, with no data.
    assert _request(stack, "GET", "/api/vhosts", settings, "Basic bm9ib2R5Om5vcGU=")[0] == 401


def test_the_listener_is_https_with_client_certificates_on_loopback_only(stack: StackHandle) -> None:
    port = stack.stack.layout.node(A).mgmt_port
    settings = stack.new_job(prefix="mg").settings(A)
    # Plain HTTP gets no HTTP answer.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /api/overview HTTP/1.0\r\n\r\n")
        try:
            reply = s.recv(64)
        except ConnectionResetError:
            reply = b""
    assert not reply.startswith(b"HTTP/")
    # TLS without a client certificate is refused.
    import ssl

    anonymous = ssl.create_default_context(cafile=settings.ca_file)
    with pytest.raises((ssl.SSLError, ConnectionResetError, TransportError)):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with anonymous.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"GET /api/overview HTTP/1.0\r\n\r\n")
                if not tls.recv(64):  # TLS 1.3 reports the missing certificate on first read
                    raise ConnectionResetError("closed")
    # Bound to loopback only, as the kernel sees it (the broker's own listener report says "[::]"
    # for this listener on 3.10).
    assert _listening(port) == {"127.0.0.1"}


def _listening(port: int) -> set[str]:
    """The local addresses on which something listens on TCP ``port`` (from /proc/net)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            if len(addr) == 8:
                out.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]))
            else:
                words = [bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, 32, 8)]
                out.add(socket.inet_ntop(socket.AF_INET6, b"".join(words)))
    return out


def test_a_revoked_certificate_is_refused_by_the_management_listener_too(stack: StackHandle, tmp_path: Any) -> None:
    from nebula_mq.security.audit import AuditLog
    from nebula_mq.security.lifecycle import revoke_cert

    job = stack.new_job(prefix="mg")
    settings = job.settings(A, f"mon-rev-{job.job_id}")
    client = ManagementClient(settings)
    assert client.queue(job.queue("activations")) is not None  # valid before
    revoke_cert(stack.stack.layout.certs_dir, A, f"mon-rev-{job.job_id}", AuditLog(tmp_path / "audit.jsonl"))
    with pytest.raises(TransportError, match="(?i)revoked"):
        ManagementClient(settings).queue(job.queue("activations"))
