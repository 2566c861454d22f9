"""Translate pika's exceptions into ``nebula_mq.errors`` (the only place that knows them)."""

from __future__ import annotations

import ssl

import pika.exceptions as px
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorException,
)

from nebula_mq.errors import (
    AccessRefused,
    ConnectionLost,
    PublishRejected,
    TransportError,
    Unroutable,
)

# Everything a pika call can raise that we translate; catch these at the boundary.
PIKA_ERRORS: tuple[type[BaseException], ...] = (
    px.AMQPError, AMQPConnectorException, ssl.SSLError, OSError,
)

_ACCESS_CODES = {403, 530}  # ACCESS_REFUSED, NOT_ALLOWED (vhost)

# TLS alerts by which a broker refuses our certificate, and what to do about each.
_REFUSED_CERTIFICATE = {
    "CERTIFICATE_EXPIRED": "the broker refused this client's certificate as expired: `nebula-mq certs rotate` "
                           "gives it a new one (or the clocks of this host and the broker disagree)",
    "CERTIFICATE_REVOKED": "the broker refused this client's certificate as revoked: the worker needs its "
                           "new files (`nebula-mq certs rotate` writes them)",
}


def _tls_hint(text: str) -> str:
    """`` (what the broker's TLS alert in ``text`` means)``, or "" for any other error."""
    upper = text.upper()
    return next((f" ({hint})" for alert, hint in _REFUSED_CERTIFICATE.items() if alert in upper), "")


def translate(exc: BaseException, what: str) -> TransportError:
    """The nebula error for a pika exception raised while doing ``what``."""
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, px.NackError):
        return PublishRejected(f"{what}: broker nacked (queue full)")
    if isinstance(exc, px.UnroutableError):
        return Unroutable(f"{what}: no queue took the message")
    if isinstance(exc, (px.ProbableAuthenticationError, px.ProbableAccessDeniedError,
                        px.AuthenticationError)):
        return AccessRefused(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, AMQPConnectionWorkflowFailed):
        causes = exc.exceptions
        inner = [translate(c, what) for c in causes]
        for err in inner:
            if isinstance(err, AccessRefused):
                return err
        text = "; ".join(str(c) for c in causes)
        return ConnectionLost(f"{what}: cannot connect: {text}{_tls_hint(text)}")
    if isinstance(exc, px.ChannelClosedByBroker):
        if exc.reply_code in _ACCESS_CODES:
            return AccessRefused(f"{what}: {exc.reply_code} {exc.reply_text}")
        return TransportError(f"{what}: channel closed by broker: {exc.reply_code} {exc.reply_text}")
    if isinstance(exc, px.ConnectionClosedByBroker):
        if exc.reply_code in _ACCESS_CODES:
            return AccessRefused(f"{what}: {exc.reply_code} {exc.reply_text}")
        return ConnectionLost(f"{what}: connection closed by broker: {exc.reply_code} {exc.reply_text}")
    if isinstance(exc, ssl.SSLError):
        return ConnectionLost(f"{what}: TLS: {exc}{_tls_hint(str(exc))}")
    if isinstance(exc, (px.AMQPConnectionError, px.ConnectionWrongStateError,
                        px.ChannelWrongStateError, px.StreamLostError, OSError)):
        return ConnectionLost(f"{what}: {type(exc).__name__}: {exc}{_tls_hint(str(exc))}")
    if isinstance(exc, AMQPConnectorException):
        return ConnectionLost(f"{what}: cannot connect: {exc}")
    return TransportError(f"{what}: {type(exc).__name__}: {exc}")
