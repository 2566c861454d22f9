"""The runtime's loop: one final class that runs every role, as dramatiq's worker runs actors.

A role is a plain object that answers :class:`StepRole`: what it reads (:meth:`~StepRole.inputs`),
what it sends before it waits (:meth:`~StepRole.produce`), what one step's messages do
(:meth:`~StepRole.apply`, which returns the step's values), and its state (:meth:`~StepRole.state`,
:meth:`~StepRole.load`). It is given its :class:`~nebula_mq.runtime.worker.Worker` (transport,
checkpoints, acks, reports), model, data and compressions; it never loops, orders, acks or saves.

The :class:`Driver` does the rest, here and nowhere else, in this order:

1. open the role (queues, outboxes, its group);
2. restore the checkpoint the group agrees on (``runtime.agreement``), from the worker's store
   or the one the role names (:attr:`Extras.resume_store`), then open the inbox that
   continues from it: one cursor per stream, ``per_step`` messages of every stream make a
   step, repeats dropped by the cursor, strangers dead-lettered (``runtime.ordered``);
3. while steps remain and no stop was agreed: let the role produce, wait for the next
   message, apply every step it completes, count it, record its values, and checkpoint
   every ``checkpoint_every`` steps and at the last (``Worker.commit``: checkpoint, the
   group's barrier, then the acks it covers);
4. checkpoint what was applied since the last checkpoint (a stop included);
5. after a complete run (not a stop), :meth:`~StepRole.after_training`;
6. close the role and the inbox, whatever happened.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import final

from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.hold import StepHold
from nebula_mq.runtime.logs import get_logger
from nebula_mq.runtime.ordered import FlowWindow, OrderedInbox
from nebula_mq.runtime.role import Extras, StepInputs, StepRole, StopCheck
from nebula_mq.runtime.worker import Worker

__all__ = ["Driver", "Extras", "StepInputs", "StepRole", "StopCheck", "drive"]

log = get_logger(__name__)

# How long one wait for the next message lasts before the loop looks at the stop flag.
POLL_S = 0.5
# How long a worker waits for its peers without a word: then, and as often while it waits, it
# says whom it waits for and how long since it last heard from them (log and status), in time
# for the console of `run` and `up`, which says why no step is made after 30 s.
WAIT_NOTICE_S = 15.0


@final
class Driver:
    """Runs ``role`` with ``worker``: the loop, the inbox, the checkpoint schedule and stops."""

    def __init__(self, worker: Worker, role: StepRole) -> None:
        self.worker, self.role = worker, role
        self.extras = role.extras()
        self.idle_polls = 0  # polls in a row that brought nothing to apply
        # When the last message came (or the wait began), whether one came at all, and when
        # the worker last said it waits (0: it has not said so since the last message).
        self.heard_at, self.heard_any, self.told_at = time.monotonic(), False, 0.0
        self.hold = StepHold.from_environment()

    @property
    def worker_id(self) -> str:
        return self.worker.worker_id

    def install_signal_handlers(self) -> None:
        self.worker.install_signal_handlers()

    def main(self) -> int:
        """Run the role to its end or to an agreed stop; the process exit code."""
        return self.worker.lifecycle(self.run)

    # ------------------------------------------------------------------ the loop

    def stopping(self) -> bool:
        """Whether to stop between steps now (a group stops where its ranks agreed to)."""
        return self.worker.agreement.stopping(self.idle_polls)

    def keep_going(self) -> bool:
        w = self.worker
        return (w.step < self.role.total or self.extras.more_to_do()) and not self.stopping()

    def run(self) -> int:
        w, role = self.worker, self.role
        w.transport.declare_dead_letter_queue()
        role.open()
        self.restore()
        if w.step > 0:  # resumed: say so, at the restored step, until the next step is done
            w.status("resuming")
        inbox = self.open_inbox()
        try:
            while self.keep_going():
                self.advance(inbox)
            # Normal end or a stop request: what was applied is checkpointed and acked.
            if (w.agreement.may_checkpoint() and (w.step > 0 or self.extras.unsaved())
                    and not w.ledger.holds(w.step)):
                self.checkpoint()
            if w.step >= role.total and not w.stop_requested.is_set():
                self.extras.after_training()
        finally:
            try:
                role.close()
            finally:
                inbox.close()
        return 0

    def window(self) -> FlowWindow:
        """The peer runs up to ``in_flight`` steps ahead, plus what it may send before our
        checkpoint catches up; up to ``checkpoint_every`` applied steps wait for the next
        checkpoint. Anything further cannot come from an honest peer."""
        every, inputs = self.worker.checkpoint_every, self.role.inputs()
        return FlowWindow(ahead=(self.role.in_flight + every) * inputs.per_step, unacked=every * inputs.per_step,
                          behind=inputs.behind * inputs.per_step)

    def restore(self) -> None:
        w = self.worker
        store = self.extras.resume_store() if self.extras.resume_store is not None else w.store
        start = w.agreement.start_step(store.steps(), w.worker_id)
        if start is None:
            return
        ck = store.load(start)
        w.step = ck.step
        self.role.load(ck)
        log.info("resumed", step=w.step)

    def checkpoint(self) -> None:
        arrays, meta = self.role.state()
        # The steps' history rows first: a kill between the two redoes those steps from the
        # older checkpoint and writes their rows again (a step's last row counts), while rows
        # written after the checkpoint would be lost for good by a kill in between.
        self.worker.write_history()
        self.worker.commit(arrays, meta)

    def open_inbox(self) -> OrderedInbox:
        self.idle_polls = 0
        self.heard_at, self.told_at = time.monotonic(), 0.0
        return OrderedInbox(self.worker, self.role.inputs(), self.worker.step, self.window(),
                            members=self.extras.members, admit=self.extras.admit,
                            other=self.extras.handle_other)

    def advance(self, inbox: OrderedInbox) -> None:
        """Let the role send, wait for the next message, apply every step the inbox finds
        complete; a role deciding its steps' members (a quorum) may find one complete with
        nothing new arrived (a wait that ran out)."""
        self.produce()
        if self.stopping():
            return
        if not inbox.receive(timeout=POLL_S):
            self.idle_polls += 1
            self.tell_wait()
        else:
            self.idle_polls = 0
            self.heard_at, self.heard_any = time.monotonic(), True
            if self.told_at:  # it had said it waits: no longer
                self.told_at = 0.0
                self.worker.waiting(None)
        while not self.stopping() and (parts := inbox.next_step()) is not None:
            self.finish_step(inbox, parts, self.apply(parts))
            # What the role sends after this step goes out before the next step is applied,
            # however many steps one arrival completes (out-of-order arrivals across stripes, a
            # replay after a restart): what a role sends depends on its step, never on timing.
            self.produce()

    def produce(self) -> None:
        """The role's :meth:`~StepRole.produce`, its time the worker's compute."""
        t0 = time.perf_counter()
        self.role.produce(self.stopping)
        self.worker.hooks.on_compute(time.perf_counter() - t0)

    def apply(self, parts: tuple[Received, ...]) -> Mapping[str, float]:
        """The role's :meth:`~StepRole.apply` of one step, its time the worker's compute."""
        t0 = time.perf_counter()
        values = self.role.apply(parts)
        self.worker.hooks.on_compute(time.perf_counter() - t0)
        return values

    def tell_wait(self) -> None:
        """After :data:`WAIT_NOTICE_S` without a message, and as often while it lasts: whom this
        worker waits for and since when, in its log and its status (``run``, ``up`` and
        ``status`` show it)."""
        now = time.monotonic()
        if now - self.heard_at < WAIT_NOTICE_S or now - self.told_at < WAIT_NOTICE_S:
            return
        self.told_at = now
        silent = round(now - self.heard_at)
        text = (f"{self.role.inputs().awaited()}: nothing for {silent} s" if self.heard_any
                else f"{self.role.inputs().awaited()}: nothing yet ({silent} s)")
        log.warning("waiting", waiting_for=text, step=self.worker.step)
        self.worker.waiting(text)

    def finish_step(self, inbox: OrderedInbox, parts: tuple[Received, ...], values: Mapping[str, float]) -> None:
        """Count the step, remember its messages (acked with the next checkpoint), record the
        values, and checkpoint on schedule and at the last step."""
        w = self.worker
        w.step += 1
        inbox.applied(*parts)
        w.record_step(values)
        if w.step % w.checkpoint_every == 0 or w.step == self.role.total:
            self.checkpoint()
        self.hold.wait(w.step, w.stop_requested.is_set)  # a chaos run's faults wait for nothing


def drive(worker: Worker, role: StepRole) -> int:
    """``Driver(worker, role)`` with SIGTERM/SIGINT handled, run to its end: a role's daemon."""
    driver = Driver(worker, role)
    driver.install_signal_handlers()
    return driver.main()
