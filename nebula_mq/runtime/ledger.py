"""The replay contract in one object: what was applied and not yet acked, and the order in
which a checkpoint makes it safe to ack.

A worker's inboxes hand it deliveries whose effect is applied in memory (``defer``);
:meth:`Ledger.commit` first waits until the broker holds every message the worker sent
(its open outboxes' confirms), then writes the checkpoint, then lets the worker's group
reach the same point (``before_ack``), and only then acks. Anything not in a durable
checkpoint is still unacked on the broker, so a restart at any moment loses nothing. A
checkpoint that cannot be written (a full disk) raises before any ack, and the deliveries
stay pending: unacked, delivered again to whoever resumes from the last good checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, final

import numpy as np

from nebula_mq.runtime.checkpoint import Checkpoint, CheckpointStore
from nebula_mq.transport.base import Delivery

if TYPE_CHECKING:
    from nebula_mq.runtime.channel import Outbox


@final
class Ledger:
    """One worker's checkpoints (``store``) and the deliveries they will ack."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.pending: list[Delivery] = []
        self.outboxes: list[Outbox] = []  # each registers itself while open; commit flushes them

    def defer(self, delivery: Delivery) -> None:
        """Ack ``delivery`` once the next checkpoint (holding its effect) is durable."""
        self.pending.append(delivery)

    def commit(self, step: int, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
               before_ack: Callable[[], None]) -> Checkpoint:
        """Checkpoint at ``step``, then ack everything it covers. First the broker must hold
        every message sent so far: a checkpoint never claims a send the broker could still lose.
        ``before_ack``: every rank of the worker's group holds its checkpoint (the agreement's
        barrier), so no rank acks a message a restart of the group would need again."""
        for outbox in list(self.outboxes):
            outbox.flush()
        ck = self.store.save(step, arrays, meta)
        before_ack()
        for delivery in self.pending:
            delivery.ack()  # False when the connection died: the repeat is deduped later
        self.pending.clear()
        return ck

    def holds(self, step: int) -> bool:
        """Whether the newest checkpoint is at ``step``."""
        steps = self.store.steps()
        return bool(steps) and steps[-1] == step
