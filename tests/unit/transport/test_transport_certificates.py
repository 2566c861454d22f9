"""The transport and its client certificate, without a broker: an expired certificate is one
clear ``CertificateError`` (before any handshake, at the first connection and at a reconnect),
and a rotated one is what the next handshake presents, even through a context built before."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pika.exceptions as px
import pytest
from cryptography import x509

from nebula_mq.errors import CertificateError, ConnectionLost
from nebula_mq.security.certs import ClusterCA, init_certs
from nebula_mq.security.lifecycle import rotate
from nebula_mq.security.audit import AuditLog
from nebula_mq.settings import BrokerSettings
from nebula_mq.transport import connection
from nebula_mq.transport.connection import IoThread, connection_parameters, ssl_context, translate
from nebula_mq.transport.identity import certificate_not_after, check_not_expired
from tests.fixtures.short_certs import now, short_lived

A = "cluster-a"


def _broker(root: Path, cn: str, port: int = 1) -> BrokerSettings:
    ident = ClusterCA(root, A).client(cn)
    return BrokerSettings(port=port, tls=True, ca_file=str(ident.ca_file), cert_file=str(ident.cert_file),
                          key_file=str(ident.key_file), server_name="localhost")


def test_an_expired_certificate_is_refused_before_any_handshake_naming_file_date_and_command(
        tmp_path: Path) -> None:
    ident = short_lived(tmp_path, A, "w1", now() - dt.timedelta(days=1))
    with pytest.raises(CertificateError) as err:
        connection_parameters(_broker(tmp_path, "w1"))
    text = str(err.value)
    assert str(ident.cert_file) in text and "expired on" in text
    assert f"nebula-mq certs rotate {tmp_path.resolve()} {A} w1" in text
    with pytest.raises(CertificateError):
        ssl_context(_broker(tmp_path, "w1"))


def test_the_end_date_is_read_again_once_the_file_changes(tmp_path: Path) -> None:
    soon = (now() + dt.timedelta(days=3)).replace(microsecond=0)
    ident = short_lived(tmp_path, A, "w1", soon)
    assert certificate_not_after(str(ident.cert_file)) == soon
    assert check_not_expired(str(ident.cert_file)) == soon
    with pytest.raises(CertificateError):
        check_not_expired(str(ident.cert_file), now=soon + dt.timedelta(seconds=1))
    rotate(tmp_path, A, "w1", AuditLog(tmp_path / "audit.jsonl"))
    assert certificate_not_after(str(ident.cert_file)) > now() + dt.timedelta(days=800)


class _Conn:
    """Stands in for the first connection: it drops after a moment, as when the broker restarts."""

    is_open = True

    def process_data_events(self, time_limit: float) -> None:
        time.sleep(0.05)
        raise px.StreamLostError("connection reset")

    def close(self) -> None:
        self.is_open = False


def test_an_expired_certificate_ends_the_io_thread_instead_of_retrying(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """First connection fine; the certificate expires meanwhile; the reconnect fails once, for good."""
    short_lived(tmp_path, A, "w1", now() + dt.timedelta(days=3))
    broker = _broker(tmp_path, "w1")
    attempts: list[int] = []

    def open_connection(b: BrokerSettings, name: str) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            return _Conn()
        return connection.ssl_context(b)  # the certificate has expired by now: raises

    monkeypatch.setattr(connection, "open_connection", open_connection)
    woken = threading.Event()
    io = IoThread(broker, "t", lambda conn: None, on_failed=woken.set)
    io.start()
    short_lived(tmp_path, A, "w1", now() - dt.timedelta(minutes=1))  # expired while connected
    assert woken.wait(10), "the I/O thread never gave up"
    assert isinstance(io.failed, CertificateError) and "expired on" in str(io.failed)
    with pytest.raises(CertificateError):
        io.call(lambda: None)
    time.sleep(0.5)
    assert len(attempts) == 2  # no retry after the expiry
    io.close()


def test_a_first_connection_with_an_expired_certificate_raises_it(tmp_path: Path) -> None:
    short_lived(tmp_path, A, "w1", now() - dt.timedelta(days=1))
    io = IoThread(_broker(tmp_path, "w1"), "t", lambda conn: None)
    with pytest.raises(CertificateError):
        io.start()


@pytest.mark.parametrize(("alert", "says"), [("SSLV3_ALERT_CERTIFICATE_EXPIRED", "as expired"),
                                             ("SSLV3_ALERT_CERTIFICATE_REVOKED", "as revoked")])
def test_a_refused_certificate_is_named_in_the_error(alert: str, says: str) -> None:
    err = translate(ssl.SSLError(1, f"[SSL: {alert}] sslv3 alert"), "connect")
    assert isinstance(err, ConnectionLost) and says in str(err)
    other = translate(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), "connect")
    assert "refused this client's certificate" not in str(other)


def _serve_once(server_ctx: ssl.SSLContext, listener: socket.socket, seen: list[int]) -> None:
    """Accept one TLS connection and record the serial of the client's certificate."""
    raw, _ = listener.accept()
    with server_ctx.wrap_socket(raw, server_side=True) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        seen.append(x509.load_der_x509_certificate(der).serial_number)
        tls.sendall(b"ok")


def _handshake(ctx: ssl.SSLContext, server_ctx: ssl.SSLContext) -> int:
    seen: list[int] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)
        t = threading.Thread(target=_serve_once, args=(server_ctx, listener, seen), daemon=True)
        t.start()
        with socket.create_connection(listener.getsockname(), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                assert tls.recv(2) == b"ok"
        t.join(10)
    assert seen, "no handshake"
    return seen[0]


def test_a_context_built_before_a_rotation_presents_the_new_certificate(tmp_path: Path) -> None:
    """What a publisher's reconnect does with the parameters it built at its start."""
    init_certs(tmp_path, [A], [(A, "w1")])
    server = ClusterCA(tmp_path, A).server()
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(server.cert_file, server.key_file)
    server_ctx.load_verify_locations(server.ca_file)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    broker = _broker(tmp_path, "w1")
    ctx = ssl_context(broker)

    def serial() -> int:
        return x509.load_pem_x509_certificate(Path(broker.cert_file).read_bytes()).serial_number

    first = serial()
    assert _handshake(ctx, server_ctx) == first
    rotate(tmp_path, A, "w1", AuditLog(tmp_path / "audit.jsonl"))
    assert serial() != first
    assert _handshake(ctx, server_ctx) == serial()
