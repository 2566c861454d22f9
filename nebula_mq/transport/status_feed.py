"""Read a job's status feed: the stream every worker of every cluster publishes its status to.

Each cluster's stream holds the status messages of its own workers and, through the federated
status exchange, of every other cluster's (``stack.provision`` ``status_feed``). A stream is not
drained by reading it: any number of readers on any host replay it from an offset, here the
messages of the last ``since_s`` seconds, with a per-consumer prefetch and manual acks, as
streams require (docs/rabbitmq.md). ``latest`` turns the messages into one row per worker: what
``nebula-mq status --feed`` prints and ``nebula-mq report --serve --feed`` shows.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from nebula_mq.settings import BrokerSettings

from .connection import short_connection

PREFETCH = 500
# The states of a worker that should still be speaking (the status file's, runtime.reporter).
LIVE = ("running", "starting", "resuming")
# The step value shown as "loss": split and ABNet workers record ``loss``, ELECTRA's ranks
# ``total_loss``, its generators ``mlm_loss``.
LOSS_KEYS = ("loss", "total_loss", "mlm_loss")


def read_status_feed(broker: BrokerSettings, stream: str, since_s: float, idle_s: float = 1.0,
                     limit_s: float = 20.0) -> list[dict[str, Any]]:
    """The status messages of the last ``since_s`` seconds in ``stream``, oldest first: read until
    none came for ``idle_s`` seconds (the end of the stream), at most ``limit_s`` seconds.
    A message that is not a JSON object is skipped (it is not one of ours)."""
    offset = datetime.fromtimestamp(time.time() - since_s, tz=timezone.utc)
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + limit_s
    with short_connection(broker, "nebula-status-feed", f"read the status feed {stream!r}") as conn:
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
    return out


def newest(messages: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each worker's newest message (by its ``sent`` time), whatever the order they came in. A
    message without a worker or a finite ``sent`` time (not one of ours) is skipped."""
    out: dict[str, dict[str, Any]] = {}
    for m in messages:
        worker, sent = str(m.get("worker", "")), m.get("sent")
        if not worker or isinstance(sent, bool) or not isinstance(sent, (int, float)) or not math.isfinite(sent):
            continue
        if sent >= out.get(worker, {}).get("sent", -1.0):
            out[worker] = m
    return out


def latest(messages: Iterable[dict[str, Any]], now: float, lost_after: float) -> list[dict[str, Any]]:
    """One row per worker, by cluster then worker: its newest message, how long ago it was sent,
    and LOST when a live worker has been silent for more than ``lost_after`` seconds."""
    rows = []
    for worker, m in sorted(newest(messages).items(), key=lambda kv: (str(kv[1].get("cluster")), kv[0])):
        heard = now - float(m.get("sent", now))
        state = str(m.get("state", "?"))
        values = m.get("values") or {}
        loss = next((values[k] for k in LOSS_KEYS if isinstance(values.get(k), (int, float))), None)
        rows.append({"worker": worker, "cluster": m.get("cluster"), "host": m.get("host"), "role": m.get("role"),
                     "state": "LOST" if state in LIVE and heard > lost_after else state, "reported": state,
                     "step": m.get("step"), "total": m.get("total"), "loss": loss,
                     "steps_per_s": m.get("steps_per_s"), "checkpoint": m.get("checkpoint"),
                     "heard_s": heard, "queues": m.get("queues") or {}})
    return rows
