"""Reading a dead-letter queue without taking anything out of it.

``peek_dead_letters`` gets up to ``limit`` messages with ``basic.get`` (no ack), keeps what an
audit needs of each (its ids, ``user_id``, reason headers; never the body), then rejects them
all with requeue: the broker puts them back where they were, marked redelivered, and the queue
holds what it held before. The connection's user needs read permission on the queue only
(``security.roles.dead_letter_auditor_permissions``); a nack is not permission-checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nebula_mq.settings import BrokerSettings

from .base import DETAIL_HEADER, MESSAGE_ID_HEADER, ORIGINAL_QUEUE_HEADER, REASON_HEADER
from .connection import short_connection

DEFAULT_LIMIT = 10_000


@dataclass(frozen=True)
class DeadLetter:
    """What the audit reads of one message in a dead-letter queue."""

    message_id: str
    # The AMQP user_id: the user of the connection that published it, checked by the broker; None
    # when the publisher set none.
    user_id: str | None
    reason: str
    detail: str
    original_queue: str


@dataclass(frozen=True)
class Peek:
    letters: tuple[DeadLetter, ...]
    # Messages the queue held beyond ``limit`` (not read).
    unread: int


def _text(headers: Mapping[str, Any], key: str) -> str:
    value = headers.get(key, "")
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def peek_dead_letters(broker: BrokerSettings, queue: str, limit: int = DEFAULT_LIMIT) -> Peek:
    """Up to ``limit`` messages of ``queue``, oldest first, all left in it (module docstring)."""
    letters: list[DeadLetter] = []
    unread = 0
    with short_connection(broker, f"dead-letter-audit/{queue}", f"read dead-letter queue {queue!r}") as conn:
        channel = conn.channel()
        last_tag = 0
        while len(letters) < limit:
            method, props, _body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            last_tag, unread = int(method.delivery_tag), int(method.message_count)
            headers = dict(props.headers or {})
            letters.append(DeadLetter(
                message_id=props.message_id or _text(headers, MESSAGE_ID_HEADER),
                user_id=props.user_id or None,
                reason=_text(headers, REASON_HEADER), detail=_text(headers, DETAIL_HEADER),
                original_queue=_text(headers, ORIGINAL_QUEUE_HEADER)))
        if last_tag:
            channel.basic_nack(last_tag, multiple=True, requeue=True)
        channel.close()
    return Peek(tuple(letters), unread)
