"""The AMQP properties of every message we publish: persistent, opaque bytes, our ids."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pika


def message_properties(
    message_id: str,
    headers: Mapping[str, Any] | None,
    correlation_id: str | None,
    reply_to: str | None,
    user_id: str | None = None,
) -> pika.BasicProperties:
    """``user_id``: the connection's user name (``identity.connection_user``), on dead letters;
    the broker refuses any other."""
    return pika.BasicProperties(
        delivery_mode=pika.DeliveryMode.Persistent,  # survives a broker restart
        content_type="application/octet-stream",
        message_id=message_id,
        headers=dict(headers) if headers else None,
        correlation_id=correlation_id,
        reply_to=reply_to,
        user_id=user_id,
    )
