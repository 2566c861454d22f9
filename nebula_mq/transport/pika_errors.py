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
        return ConnectionLost(f"{what}: cannot connect: {'; '.join(str(c) for c in causes)}")
    if isinstance(exc, px.ChannelClosedByBroker):
        if exc.reply_code in _ACCESS_CODES:
            return AccessRefused(f"{what}: {exc.reply_code} {exc.reply_text}")
        return TransportError(f"{what}: channel closed by broker: {exc.reply_code} {exc.reply_text}")
    if isinstance(exc, px.ConnectionClosedByBroker):
        if exc.reply_code in _ACCESS_CODES:
            return AccessRefused(f"{what}: {exc.reply_code} {exc.reply_text}")
        return ConnectionLost(f"{what}: connection closed by broker: {exc.reply_code} {exc.reply_text}")
    if isinstance(exc, ssl.SSLError):
        return ConnectionLost(f"{what}: TLS: {exc}")
    if isinstance(exc, (px.AMQPConnectionError, px.ConnectionWrongStateError,
                        px.ChannelWrongStateError, px.StreamLostError, OSError)):
        return ConnectionLost(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, AMQPConnectorException):
        return ConnectionLost(f"{what}: cannot connect: {exc}")
    return TransportError(f"{what}: {type(exc).__name__}: {exc}")
