"""What every role is given: a runtime worker with the job's message authentication.

The runtime (``nebula_mq.runtime``) signs, verifies and seals with whatever it is
given and never reads key files; this is where the roles give it the job's key
ring (``nebula_mq.security.auth.load_message_auth``)."""

from __future__ import annotations

from collections.abc import Sequence

from nebula_mq.runtime.hooks import Hook, MessageEvent
from nebula_mq.runtime.worker import Worker
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.auth import load_message_auth
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport


class DeadLetterAudit(Hook):
    """Every message a worker dead-letters, whatever the reason (malformed, bad checksum, out
    of window, NaN...), goes to the job's audit log as ``message_dead_lettered``; failed tags
    and replays are also audited where they are caught (``message_rejected``)."""

    def __init__(self, audit: AuditLog, consumer: str) -> None:
        self.audit, self.consumer = audit, consumer

    def on_dead_letter(self, event: MessageEvent, reason: str, detail: str) -> None:
        self.audit.record("message_dead_lettered", reason=reason, detail=detail[:500], flow=event.flow,
                          message_id=event.message_id, consumer=self.consumer)


def role_worker(settings: Settings, cluster: str, worker_id: str, role: str, transport: Transport | None = None,
                hooks: Sequence[Hook] = (), checkpoint_every: int = 10) -> Worker:
    """A :class:`Worker` for ``role`` authenticated with the job's key (``<run_dir>/keys/job.key``),
    whose dead letters are audited (:class:`DeadLetterAudit`)."""
    audit = DeadLetterAudit(AuditLog(settings.run_dir / "audit" / "audit.jsonl"), worker_id)
    return Worker(settings, cluster, worker_id, transport, (audit, *hooks), checkpoint_every,
                  auth=load_message_auth(settings, worker_id), role=role)
