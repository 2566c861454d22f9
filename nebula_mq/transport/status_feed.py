"""Read a job's status feed: the stream every worker of every cluster publishes its status to.

Each cluster's stream holds the status messages of its own workers and, through the federated
status exchange, of every other cluster's (``stack.provision`` ``status_feed``). A stream is not
drained by reading it: any number of readers on any host replay it from an offset, here the
messages of the last ``since_s`` seconds, with a per-consumer prefetch and manual acks, as
streams require (docs/RABBITMQ.md).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from nebula_mq.settings import BrokerSettings

from .connection import open_connection
from .pika_errors import PIKA_ERRORS, translate

PREFETCH = 500


def read_status_feed(broker: BrokerSettings, stream: str, since_s: float, idle_s: float = 1.0,
                     limit_s: float = 20.0) -> list[dict[str, Any]]:
    """The status messages of the last ``since_s`` seconds in ``stream``, oldest first: read until
    none came for ``idle_s`` seconds (the end of the stream), at most ``limit_s`` seconds.
    A message that is not a JSON object is skipped (it is not one of ours)."""
    offset = datetime.fromtimestamp(time.time() - since_s, tz=timezone.utc)
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + limit_s
    conn = open_connection(broker, "nebula-status-feed")  # raises TransportError
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=PREFETCH)  # streams refuse global QoS and auto-ack
        for method, _props, body in channel.consume(stream, arguments={"x-stream-offset": offset},
                                                   inactivity_timeout=idle_s):
            if method is None:
                break
            channel.basic_ack(method.delivery_tag)
            try:
                message = json.loads(body)
            except ValueError:
                continue
            if isinstance(message, dict):
                out.append(message)
            if time.monotonic() > deadline:
                break
        channel.cancel()
    except PIKA_ERRORS as exc:
        raise translate(exc, f"read the status feed {stream!r}") from None
    finally:
        try:
            conn.close()
        except PIKA_ERRORS:
            pass
    return out
