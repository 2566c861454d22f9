"""What every role is given: a runtime worker with the job's message authentication.

A role's entry point (its ``main``) builds the worker of the role's
:class:`WorkerIdentity` over the transport to its cluster's broker, gives it to the role's
constructor and to the driver: ``drive(worker, role)``. Tests give an in-memory transport
and a key of their own instead. The runtime (``nebula_mq.runtime``) signs, verifies and
seals with whatever it is given and never reads key files; this is where the roles give it
the job's key ring (``nebula_mq.security.auth.load_message_auth``)."""

from __future__ import annotations

from dataclasses import dataclass

from nebula_mq.runtime.hooks import Hook, MessageEvent
from nebula_mq.runtime.worker import Worker, make_transport
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.auth import load_message_auth
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from nebula_mq.wire.auth import EnvelopeAuth


class DeadLetterAudit(Hook):
    """Every message a worker dead-letters, whatever the reason (malformed, bad checksum, out
    of window, NaN...), goes to the job's audit log as ``message_dead_lettered``; failed tags
    and replays are also audited where they are caught (``message_rejected``)."""

    def __init__(self, audit: AuditLog, consumer: str) -> None:
        self.audit, self.consumer = audit, consumer

    def on_dead_letter(self, event: MessageEvent, reason: str, detail: str) -> None:
        self.audit.record("message_dead_lettered", reason=reason, detail=detail[:500], flow=event.flow,
                          message_id=event.message_id, consumer=self.consumer)


@dataclass(frozen=True)
class WorkerIdentity:
    """Who a role's worker is: its cluster, its worker id (unique within the job: its
    checkpoint dir, status and metrics files), its role's name, and its checkpoint period."""

    settings: Settings
    cluster: str
    worker_id: str
    role: str
    checkpoint_every: int = 10

    def worker(self, transport: Transport, auth: EnvelopeAuth | None = None) -> Worker:
        """The :class:`Worker` over ``transport``, authenticated with ``auth`` or else the job's
        key (``<run_dir>/keys/job.key``), its dead letters audited (:class:`DeadLetterAudit`)."""
        settings = self.settings
        audit = DeadLetterAudit(AuditLog(settings.run_dir / "audit" / "audit.jsonl"), self.worker_id)
        return Worker(settings, self.cluster, self.worker_id, transport, (audit,), self.checkpoint_every,
                      auth=auth if auth is not None else load_message_auth(settings, self.worker_id), role=self.role)

    def broker_worker(self) -> Worker:
        """The worker over the transport to its cluster's RabbitMQ broker: an entry point's."""
        return self.worker(make_transport(self.settings, self.cluster))

