"""The publisher's messages on the wire, each until the broker confirms it, found by delivery tag.

A channel in confirm mode numbers what is published on it 1, 2, ... (per channel: a new channel
starts again at 1); the broker acks or nacks by that tag, a ``multiple`` confirm settling every
tag up to its own. A message the broker returns (``mandatory``: no queue took it) is acked after
the return, so the return only marks it. The publisher's I/O thread is the only user.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field

import pika

from nebula_mq.errors import PublishRejected, TransportError, Unroutable

from .base import Outgoing
from .properties import message_properties
from .retry import Patience


@dataclass(eq=False)
class Unconfirmed:
    """One message until the broker confirms it (or its patience runs out)."""

    exchange: str
    queue: str
    body: bytes
    props: pika.BasicProperties
    patience: Patience
    future: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    returned: bool = False  # the broker returned it (unroutable); its ack follows

    @classmethod
    def of(cls, outgoing: Outgoing, exchange: str, patience: Patience) -> Unconfirmed:
        """``outgoing``, to be published through ``exchange``."""
        body = outgoing.body if isinstance(outgoing.body, bytes) else bytes(outgoing.body)
        props = message_properties(outgoing.message_id, outgoing.headers, outgoing.correlation_id, outgoing.reply_to,
                                   outgoing.user_id)
        return cls(exchange, outgoing.queue, body, props, patience)

    @property
    def message_id(self) -> str:
        return str(self.props.message_id)


class Confirms:
    """Delivery tag -> message, for the messages published on the current channel."""

    def __init__(self) -> None:
        self._unconfirmed: dict[int, Unconfirmed] = {}  # in tag order
        self._next_tag = 1

    def new_channel(self) -> None:
        """A channel entered confirm mode: its tags start at 1."""
        self._next_tag = 1

    def sent(self, message: Unconfirmed) -> None:
        """``message`` was published on the current channel, under the next tag."""
        self._unconfirmed[self._next_tag] = message
        self._next_tag += 1

    def returned(self, message_id: str | None) -> None:
        """The broker returned a message: marks the oldest copy of it not yet marked."""
        for message in self._unconfirmed.values():
            if message.message_id == message_id and not message.returned:
                message.returned = True
                return

    def settle(self, tag: int, multiple: bool) -> list[Unconfirmed]:
        """The messages a confirm of ``tag`` settles (each one once)."""
        tags = [t for t in self._unconfirmed if t <= tag] if multiple else [tag]
        return [m for m in (self._unconfirmed.pop(t, None) for t in tags) if m is not None]

    def outcomes(self, method: pika.spec.Basic.Ack | pika.spec.Basic.Nack) -> list[tuple[Unconfirmed, TransportError | None]]:
        """Each message a confirm settles, with None when the broker holds it, or why it must go
        again: nacked (the queue is full) or returned before its ack (no queue took it)."""
        out: list[tuple[Unconfirmed, TransportError | None]] = []
        for message in self.settle(method.delivery_tag, method.multiple):
            if not isinstance(method, pika.spec.Basic.Ack):
                out.append((message, PublishRejected(f"publish to {message.queue!r}: broker nacked (queue full)")))
            elif message.returned:
                message.returned = False
                out.append((message, Unroutable(f"publish to {message.queue!r}: no queue took the message")))
            else:
                out.append((message, None))
        return out

    def take_all(self) -> list[Unconfirmed]:
        """Every message still unconfirmed (their channel is gone), forgotten here."""
        out, self._unconfirmed = list(self._unconfirmed.values()), {}
        return out
