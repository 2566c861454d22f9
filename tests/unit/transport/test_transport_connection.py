"""Connection settings and the pika error boundary (no broker needed)."""

from __future__ import annotations

from pathlib import Path

import pika
import pika.exceptions as px
import pytest

from nebula_mq.errors import (
    AccessRefused,
    ConnectionLost,
    PublishRejected,
    TransportError,
    Unroutable,
)
from nebula_mq.settings import BrokerSettings
from nebula_mq.transport.connection import connection_parameters, translate
from nebula_mq.transport.retry import Backoff


def test_plaintext_parameters_use_plain_credentials_and_heartbeat() -> None:
    params = connection_parameters(BrokerSettings(port=5672, tls=False, heartbeat_s=4, vhost="v"))
    assert isinstance(params.credentials, pika.PlainCredentials)
    assert (params.heartbeat, params.virtual_host, params.ssl_options) == (4, "v", None)
    assert params.blocked_connection_timeout is not None


def test_tls_without_identity_files_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(TransportError, match="ca_file"):
        connection_parameters(BrokerSettings(tls=True))
    missing = BrokerSettings(
        tls=True, ca_file=str(tmp_path / "ca.pem"), cert_file="c.pem", key_file="k.pem"
    )
    with pytest.raises(TransportError, match="cannot load TLS identity"):
        connection_parameters(missing)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (px.NackError([]), PublishRejected),
        (px.UnroutableError([]), Unroutable),
        (px.ProbableAuthenticationError("x"), AccessRefused),
        (px.ChannelClosedByBroker(403, "ACCESS_REFUSED"), AccessRefused),
        (px.ConnectionClosedByBroker(530, "NOT_ALLOWED"), AccessRefused),
        (px.ChannelClosedByBroker(406, "PRECONDITION_FAILED"), TransportError),
        (px.ConnectionClosedByBroker(320, "CONNECTION_FORCED"), ConnectionLost),
        (px.StreamLostError("eof"), ConnectionLost),
        (ConnectionResetError("reset"), ConnectionLost),
    ],
)
def test_pika_errors_become_nebula_errors(exc: BaseException, expected: type) -> None:
    err = translate(exc, "doing x")
    assert type(err) is expected
    assert "doing x" in str(err)


def test_backoff_grows_to_its_maximum_with_jitter() -> None:
    backoff = Backoff(initial=0.1, maximum=0.8)
    delays = [backoff.next_delay() for _ in range(6)]
    caps = [0.1, 0.2, 0.4, 0.8, 0.8, 0.8]
    assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    backoff.reset()
    assert backoff.next_delay() <= 0.1
