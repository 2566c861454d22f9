"""The roles' common base: a runtime worker given the job's message authentication.

The runtime (``nebula_mq.runtime``) signs, verifies and seals with whatever it is
given and never reads key files; this is where the roles give it the job's key
ring (``nebula_mq.security.auth.load_message_auth``)."""

from __future__ import annotations

from collections.abc import Sequence

from nebula_mq.runtime.hooks import Hook
from nebula_mq.runtime.worker import Worker
from nebula_mq.security.auth import load_message_auth
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport


class RoleWorker(Worker):
    """A :class:`Worker` authenticated with the job's key (``<run_dir>/keys/job.key``)."""

    def __init__(self, settings: Settings, cluster: str, worker_id: str, transport: Transport | None = None,
                 hooks: Sequence[Hook] = (), checkpoint_every: int = 10) -> None:
        super().__init__(settings, cluster, worker_id, transport, hooks, checkpoint_every,
                         auth=load_message_auth(settings, worker_id))
