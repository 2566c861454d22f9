"""Envelopes over a transport: what a role sends and receives on a flow.

:class:`Outbox` encodes tensors with their codecs, wraps them in an envelope
and publishes it, confirmed, to the flow's queue on the local broker.
:class:`Inbox` takes deliveries off a flow's queue and turns each into exactly
one of: a :class:`Received` message for the role (repeats included: the
ordered inbox that counts the flow's progress drops them, ``runtime.ordered``);
or a condemned message, dead-lettered with its reason (checksum,
version, schema, authentication tag, replay window, codec, NaN, wrong job,
wrong flow). Every envelope is signed with the job's HMAC key and, when the
job asks for it, sealed with AES-GCM (``nebula_mq.security.auth``). The role never sees a
message it cannot trust, and the consumer keeps going.

Message identity is ``job/flow/producer/seq`` (``topology.message_id``); ``seq``
is the micro-batch index, so a worker that recomputes a micro-batch after a
restart sends a message with the same id, which the receiver's counter discards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nebula_mq import topology
from nebula_mq.codecs import Codec
from nebula_mq.codecs.flow import EncodedTensors
from nebula_mq.errors import NebulaError, NonFiniteTensor, UnknownJob, WireError
from nebula_mq.runtime.hooks import MessageEvent
from nebula_mq.runtime.logs import get_logger
from nebula_mq.transport.base import Delivery
from nebula_mq.wire import Envelope, decode_envelope, encode_envelope, pack_tensors, unpack_tensors
from nebula_mq.wire.envelope import TensorRecord
from nebula_mq.wire.limits import check_outgoing

if TYPE_CHECKING:
    from nebula_mq.runtime.worker import Worker

log = get_logger(__name__)


@dataclass(frozen=True)
class Received:
    envelope: Envelope
    tensors: Mapping[str, np.ndarray]
    delivery: Delivery

    @property
    def micro_batch(self) -> int:
        return self.envelope.micro_batch

    @property
    def message_id(self) -> str:
        return self.envelope.message_id

    @property
    def meta(self) -> Mapping[str, Any]:
        return self.envelope.meta


def _event(env: Envelope, raw: int, wire: int, redelivered: bool = False) -> MessageEvent:
    return MessageEvent(env.flow, env.step, env.micro_batch, env.message_id, raw, wire, redelivered)


class Outbox:
    """Publishes envelopes of one flow from one producer; a striped flow's micro-batch ``i`` goes
    to stripe ``i % stripes`` (``topology.stripe_of``), under the stripe's name."""

    def __init__(self, worker: Worker, flow: topology.Flow, producer_id: str) -> None:
        self.worker = worker
        self.flow = flow
        self.producer_id = producer_id
        self.allow_non_finite = worker.settings.codec.allow_non_finite  # [codec] allow_non_finite
        self.publisher = worker.transport.publisher()
        worker.ledger.outboxes.append(self)  # its commit waits for our confirms (``Ledger.commit``)

    def send(self, *, step: int, micro_batch: int, tensors: Mapping[str, tuple[np.ndarray, Codec]] | None = None,
             encoded: EncodedTensors | None = None, meta: Mapping[str, Any] | None = None,
             reply_to: str | None = None, correlation_id: str | None = None) -> str:
        """Encode and publish; returns the message id. A frame above ``[transport]
        max_message_bytes`` raises ``MessageTooLarge`` with nothing published. It returns once
        the message is handed to the publisher's window of confirms: :meth:`flush`, which
        ``Worker.commit`` calls before every checkpoint, returns once the broker holds it.
        Until then the role computes on.

        ``tensors`` are encoded here, each with its codec; ``encoded`` were encoded by
        the flow's :class:`nebula_mq.codecs.flow.FlowCompression` (once, with its state).
        """
        records = list(pack_tensors({n: a for n, (a, _) in (tensors or {}).items()},
                                    {n: c for n, (_, c) in (tensors or {}).items()},
                                    allow_non_finite=self.allow_non_finite))
        records += [TensorRecord(name, enc.shape, enc.dtype, spec, enc) for name, (spec, enc) in (encoded or {}).items()]
        stripe = topology.stripe_of(self.flow, micro_batch)
        env = Envelope(self.worker.settings.job.id, stripe.name, step, micro_batch, micro_batch,
                       self.producer_id, tuple(records), dict(meta or {}))
        auth = self.worker.auth
        body = encode_envelope(env, signer=auth.signer())
        if self.worker.settings.security.encrypt_payloads:
            body = auth.seal(body)
        # Refused here, before anything is published: MessageTooLarge names a codec that fits.
        check_outgoing(env, len(body), self.worker.settings.transport.max_message_bytes)
        self.publisher.publish_async(self.worker.transport.queue_for(stripe), body, env.message_id,
                                     correlation_id=correlation_id, reply_to=reply_to)
        raw = sum(math.prod(r.shape) * np.dtype(r.dtype).itemsize for r in records)
        self.worker.hooks.on_published(_event(env, raw, len(body)))
        return env.message_id

    def flush(self) -> None:
        """Wait until the broker holds every message sent so far (or raise why it never will)."""
        self.publisher.flush()

    def close(self) -> None:
        """Stop publishing; what is not confirmed yet is dropped here (call :meth:`flush` first
        to keep it): no checkpoint covers it, so a resumed worker sends it again."""
        if self in self.worker.ledger.outboxes:
            self.worker.ledger.outboxes.remove(self)
        self.publisher.close()


class Inbox:
    """Trusted messages of one flow; see the module docstring. Repeats are recognised where the
    flow's progress is counted, by :class:`~nebula_mq.runtime.ordered.OrderedInbox`."""

    def __init__(self, worker: Worker, flow: topology.Flow, *, held: int = 0) -> None:
        """``held``: deliveries the role keeps unacked on purpose (applied but not yet
        checkpointed, or waiting for their turn). The prefetch must exceed it, or the
        broker stops delivering while the role waits for the message that would let
        it checkpoint: a deadlock."""
        self.worker = worker
        self.flow = flow
        self.allow_non_finite = worker.settings.codec.allow_non_finite  # [codec] allow_non_finite
        self.max_bytes = worker.settings.transport.max_message_bytes
        prefetch = worker.settings.transport.prefetch + held
        queue = worker.transport.queue_for(flow)
        worker.watched_queues.add(queue)
        self.consumer = worker.transport.consume(queue, prefetch)

    def get(self, timeout: float | None = None) -> Received | None:
        """The next trusted, new message; None when nothing came within ``timeout``."""
        delivery = self.consumer.get(timeout)
        while delivery is not None:
            received = self._admit(delivery)
            if received is not None:
                return received
            delivery = self.consumer.get(0)
        return None

    def _admit(self, delivery: Delivery) -> Received | None:
        auth = self.worker.auth
        try:
            frame = delivery.body
            if self.worker.settings.security.encrypt_payloads:
                frame = auth.open(frame)
            env = decode_envelope(frame, max_bytes=self.max_bytes,
                                  max_decoded_bytes=self.worker.settings.transport.decoded_bytes_cap)
            auth.verify(env)  # HMAC tag and replay window; audited on failure
            if env.job_id != self.worker.settings.job.id:
                raise UnknownJob(f"message of job {env.job_id!r} on job "
                                 f"{self.worker.settings.job.id!r}'s queue")
            if env.flow != self.flow.name:
                raise UnknownJob(f"message of flow {env.flow!r} on flow {self.flow.name!r}")
            tensors = unpack_tensors(env, max_decoded_bytes=self.worker.settings.transport.decoded_bytes_cap)
            if not self.allow_non_finite:
                for name, arr in tensors.items():
                    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                        raise NonFiniteTensor(f"tensor {name!r} holds NaN or Inf")
        except WireError as exc:
            self._dead_letter(delivery, exc)
            return None
        raw = sum(int(a.nbytes) for a in tensors.values())
        self.worker.hooks.on_received(_event(env, raw, len(delivery.body), delivery.redelivered))
        return Received(env, tensors, delivery)

    def _dead_letter(self, delivery: Delivery, exc: NebulaError) -> None:
        log.error("dead_letter", reason=exc.reason, detail=str(exc), message_id=delivery.message_id,
                  queue=delivery.queue)
        # Audited before it is moved and acked: an audit log that cannot take the record stops
        # the worker with the message still on its queue. A move that fails after the record
        # (a lost connection) brings the message back, and it is recorded twice: harmless.
        self.worker.hooks.on_dead_letter(
            MessageEvent(self.flow.name, message_id=delivery.message_id), exc.reason, str(exc))
        delivery.dead_letter(exc.reason, str(exc))

    def reject(self, received: Received, exc: NebulaError) -> None:
        """Condemn a decoded message the role found unacceptable (e.g. out of window)."""
        self._dead_letter(received.delivery, exc)

    def discard_duplicate(self, received: Received) -> None:
        """A repeat of something already applied or already held: ack it with the next
        checkpoint, never apply it. Its effect is applied, but maybe only in memory: acking now
        would lose the message if the first copy's connection died (after a broker restart
        this copy is the only one left on the broker) and the worker crashed before
        checkpointing."""
        self.worker.hooks.on_duplicate(_event(received.envelope, 0, len(received.delivery.body)))
        self.worker.ledger.defer(received.delivery)

    def applied(self, received: Received) -> None:
        """The role applied the message's effect: ack it with the next checkpoint."""
        self.worker.ledger.defer(received.delivery)

    def close(self) -> None:
        self.consumer.close()
