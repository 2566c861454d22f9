"""The loop every role runs: the runtime's, not the role's.

As dramatiq's worker owns the loop and calls the actor, :class:`LoopWorker` owns
the loop and calls the role. Every role runs the same sequence:

1. declare its queues and open its outboxes (:meth:`~LoopWorker.open`);
2. restore the latest checkpoint (:meth:`~LoopWorker.restore`), then open the
   inbox that continues from it (:meth:`~LoopWorker.open_inbox`);
3. advance while there is work and no stop was requested
   (:meth:`~LoopWorker.advance`: one unit of work, a step or what is ready);
4. finish (:meth:`~LoopWorker.finish`: e.g. wait for the peer's last sync token);
5. checkpoint what was applied since the last checkpoint, so everything it
   covers is acked (``Worker.commit``);
6. after a complete run (not a stop), :meth:`~LoopWorker.after_training`;
7. close the outboxes and the inbox, whatever happened.

Roles whose step is one in-order message use :class:`~nebula_mq.runtime.stepped.SteppedWorker`,
which also owns the step count and the checkpoint schedule.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Generic, Protocol, TypeVar

from nebula_mq.runtime.worker import Worker


class Closable(Protocol):
    def close(self) -> None: ...


InboxT = TypeVar("InboxT", bound=Closable)


class LoopWorker(Worker, Generic[InboxT]):
    """A worker whose loop is the runtime's; a role implements the steps of it. ``InboxT`` is
    what the role reads from (an ``OrderedInbox``, or ``OrderedStreams`` for several streams)."""

    total: int  # steps to train

    def open(self) -> None:
        """Declare the queues and open the outboxes (before the checkpoint is restored)."""

    @abstractmethod
    def restore(self) -> None:
        """Load the latest checkpoint, if any (``self.step`` included)."""

    @abstractmethod
    def open_inbox(self) -> InboxT:
        """The inbox that continues where the restored checkpoint ends."""

    @abstractmethod
    def advance(self, inbox: InboxT) -> bool:
        """One unit of work; False to leave the loop now (a stop agreed with the peers)."""

    @abstractmethod
    def checkpoint(self) -> None:
        """Save the state at ``self.step`` and ack what it covers (``Worker.commit``)."""

    def keep_going(self) -> bool:
        """Whether the loop goes on. A role in a group that must stop at the same step as its
        peers leaves the stop flag to :meth:`advance` (a lone stop would hang the others)."""
        return (self.step < self.total or self.more_to_do()) and not self.stop_requested.is_set()

    def more_to_do(self) -> bool:
        """Keep going after the last step (e.g. evaluation batches)."""
        return False

    def finish(self, inbox: InboxT) -> None:
        """After the loop, before the final checkpoint."""

    def unsaved(self) -> bool:
        """Whether anything since the start needs a final checkpoint (beyond applied steps)."""
        return self.step > 0

    def needs_final_checkpoint(self) -> bool:
        return self.unsaved() and not self.has_checkpoint_at_step()

    def after_training(self) -> None:
        """Called once every step is done and checkpointed (not after a stop request)."""

    def close(self) -> None:
        """Close the outboxes :meth:`open` opened."""

    def run(self) -> int:
        self.transport.declare_dead_letter_queue()
        self.open()
        self.restore()
        if self.step > 0:  # resumed: say so, at the restored step, until the next step is done
            self.write_status("resuming")
        inbox = self.open_inbox()
        try:
            while self.keep_going():
                if not self.advance(inbox):
                    break
            self.finish(inbox)
            # Normal end or a stop request: what was applied is checkpointed and acked.
            if self.needs_final_checkpoint():
                self.checkpoint()
            if self.step >= self.total and not self.stop_requested.is_set():
                self.after_training()
        finally:
            self.close()
            inbox.close()
        return 0
