"""A broker's management API over HTTPS: what AMQP cannot say about a queue, and the way
``nebula-mq provision`` administers a broker it does not run (``stack.admin.HttpAdmin``).

A passive declare gives a queue's ready messages, not their size. The management
plugin knows both. It listens on HTTPS only, with the same mutual TLS as AMQP (the
worker's own certificate), and each job has a read-only monitoring user
(``topology.monitoring_user``) whose password lies in a file
(``BrokerSettings.management_password_file``).

The plugin refreshes queue statistics every few seconds (``collect_statistics_interval``),
so a size may lag the message count read over AMQP by that much.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import structlog

from nebula_mq.errors import ConnectionLost, TransportError
from nebula_mq.settings import BrokerSettings
from nebula_mq.transport.connection import ssl_context
from nebula_mq.transport.retry import Backoff

log = structlog.get_logger(__name__)

TIMEOUT_S = 5.0
# How long queue sizes are not asked for after the API could not be reached.
UNREACHABLE_PAUSE_S = 600.0
# The first pause before asking a busy broker again (transport.retry.Backoff doubles it, with jitter).
RETRY_PAUSE_S = 1.0
# Methods whose repetition changes nothing more than their first success did.
IDEMPOTENT = ("GET", "DELETE")


@dataclass(frozen=True)
class QueueStats:
    """A queue as the management API last saw it; None where it has no statistics yet."""

    messages_ready: int | None
    message_bytes_ready: int | None


class ManagementClient:
    """Requests to one broker's management API: reads as the job's monitoring user, and the
    writes of an administrator who provisions the broker (``stack.admin.HttpAdmin``)."""

    def __init__(self, broker: BrokerSettings) -> None:
        if not broker.management_port:
            raise TransportError("the broker settings name no management_port")
        try:
            password = Path(broker.management_password_file).read_text().strip()
        except OSError as exc:
            raise TransportError(f"cannot read the management API password file ({exc})") from None
        self.broker = broker
        token = base64.b64encode(f"{broker.management_user}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}", "Accept": "application/json"}
        self.context = ssl_context(broker)

    def get(self, path: str) -> Any:
        """The decoded JSON of ``GET /api/<path>``; None on 404; TransportError otherwise."""
        return self.request("GET", path)

    def request(self, method: str, path: str, body: Any = None, timeout: float = TIMEOUT_S,
                attempts: int = 1) -> Any:
        """``METHOD /api/<path>`` with a JSON ``body``; the decoded answer (None when empty or
        404); TransportError for any other failure. Writes need a user with the rights
        (the provisioning administrator, never the monitoring user).

        A busy broker answers 5xx when its statistics or vhost supervisors miss an internal
        deadline; a GET or DELETE (idempotent: a repeated DELETE finds 404) is then asked
        again, up to ``attempts`` times in all, after a pause that doubles. So is a GET that
        failed to connect or timed out; a write whose answer never came is reported, not resent."""
        attempt, pauses = 1, Backoff(initial=RETRY_PAUSE_S, maximum=4 * RETRY_PAUSE_S)
        while True:
            try:
                status, reason, answer = self._exchange(method, path, body, timeout)
            except TransportError:
                if attempt >= attempts or method != "GET":
                    raise
            else:
                if status < 500 or attempt >= attempts or method not in IDEMPOTENT:
                    break
            time.sleep(pauses.next_delay())
            attempt += 1
        if status == 404:
            return None
        if status not in (200, 201, 204):
            detail = answer[:300].decode(errors="replace")
            tries = f" (after {attempt} attempts)" if attempt > 1 else ""
            raise TransportError(f"management API {method} {path}: HTTP {status} {reason} {detail}".rstrip() + tries)
        if not answer.strip():
            return None
        try:
            return json.loads(answer)
        except ValueError as exc:
            raise TransportError(f"management API {path}: not JSON ({exc})") from None

    def _exchange(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, str, bytes]:
        """One HTTPS request: the status, its reason and the body."""
        b = self.broker
        data = None if body is None else json.dumps(body).encode()
        headers = self.headers if data is None else {**self.headers, "Content-Type": "application/json"}
        # Connect to the broker's address and check its certificate against server_name, as the
        # AMQP connection does (workers often reach their broker as 127.0.0.1).
        conn = http.client.HTTPConnection(b.server_name, b.management_port, timeout=timeout)
        try:
            raw = socket.create_connection((b.host, b.management_port), timeout=timeout)
            conn.sock = self.context.wrap_socket(raw, server_hostname=b.server_name)
            conn.request(method, f"/api/{path}", body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.reason, resp.read()
        except OSError as exc:  # refused, unreachable, timed out: the API is not there for us
            raise ConnectionLost(f"management API {method} {path}: {exc}") from None
        except http.client.HTTPException as exc:
            raise TransportError(f"management API {method} {path}: {exc}") from None
        finally:
            conn.close()

    def queue(self, queue: str) -> QueueStats | None:
        """Ready messages and their bytes in ``queue`` of this broker's vhost; None when it does not exist."""
        vhost = quote(self.broker.vhost, safe="")
        body = self.get(f"queues/{vhost}/{quote(queue, safe='')}?columns=messages_ready,message_bytes_ready")
        if body is None:
            return None
        if not isinstance(body, dict):  # a queue this new has no statistics yet: the plugin answers []
            return QueueStats(None, None)
        return QueueStats(_count(body.get("messages_ready")), _count(body.get("message_bytes_ready")))


def _count(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


class QueueSizes:
    """Queues' sizes in bytes, read through a management client made at the first call (it
    reads the password file); None when the broker settings name no management API, and for
    :data:`UNREACHABLE_PAUSE_S` after the API could not be reached (a rank host, where the API
    listens on the broker host's loopback only), said once per episode."""

    def __init__(self, broker: BrokerSettings) -> None:
        self.broker = broker
        self._client: ManagementClient | None = None
        self._paused_until = 0.0

    def ready_bytes(self, queue: str) -> int | None:
        if not self.broker.management_port or time.monotonic() < self._paused_until:
            return None
        if self._client is None:
            self._client = ManagementClient(self.broker)
        try:
            stats = self._client.queue(queue)
        except ConnectionLost as exc:
            if not self._paused_until:
                log.warning("queue_sizes_unavailable", error=str(exc), retry_in_s=UNREACHABLE_PAUSE_S,
                            hint="the management API is not reachable from this host: queue sizes are sampled "
                                 "in messages only (the broker host's workers sample the bytes)")
            self._paused_until = time.monotonic() + UNREACHABLE_PAUSE_S
            return None
        return None if stats is None else stats.message_bytes_ready
