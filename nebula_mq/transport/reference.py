"""Plain pika, publishing as its documentation shows: the reference ``bench transport
--compare-pika`` measures our publisher against, over the same TLS and in the same run.

One ``BlockingConnection`` (the same connection parameters as ours: TLS, certificate login),
``confirm_delivery()``, and one persistent, mandatory ``basic_publish`` per message, each returning
once the broker confirmed it: the same guarantee our ``Publisher.publish`` gives, without our
I/O thread, routing cache, retry loop and statistics.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from nebula_mq.errors import TransportError
from nebula_mq.settings import BrokerSettings

from .connection import PIKA_ERRORS, close_quietly, open_connection
from .publisher import message_properties


class PlainPikaPublisher:
    """Publishes ``bodies`` ((message id, body) pairs) to ``exchange`` with ``routing_key`` from a
    thread of its own, once started; ``join`` reports the first failure."""

    def __init__(self, broker: BrokerSettings, exchange: str, routing_key: str,
                 bodies: Sequence[tuple[str, bytes]]) -> None:
        self._bodies = bodies
        self._exchange, self._key = exchange, routing_key
        # Connected before the clock starts, as our publishers are; used by its thread only after.
        self._conn = open_connection(broker, "pika-reference")
        self._channel = self._conn.channel()
        self._channel.confirm_delivery()
        self._thread = threading.Thread(target=self._run, name="pika-reference", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> PlainPikaPublisher:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for message_id, body in self._bodies:
                self._channel.basic_publish(self._exchange, self._key, body,
                                            message_properties(message_id, None, None, None), mandatory=True)
        except PIKA_ERRORS as exc:
            self.error = exc
        finally:
            close_quietly(self._conn)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self.error is not None:
            raise TransportError(f"plain pika publisher failed: {self.error!r}") from None
        if self._thread.is_alive():
            raise TransportError(f"plain pika publisher still busy after {timeout} s")
