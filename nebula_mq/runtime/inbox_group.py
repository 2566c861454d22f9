"""Several flows' inboxes read as one stream (the ELECTRA root reads every generator's flow)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from nebula_mq.errors import NebulaError
from nebula_mq.runtime.channel import Inbox, Received


class InboxGroup:
    """Several flows' inboxes read as one stream of messages (the root's results flows).
    Order and dedupe are :class:`~nebula_mq.runtime.ordered.OrderedStreams`'s.
    """

    # How long one inbox is waited on before the next is looked at, when all are empty.
    POLL_S = 0.01

    def __init__(self, inboxes: Sequence[Inbox]) -> None:
        if not inboxes:
            raise ValueError("at least one inbox")
        self.inboxes = list(inboxes)
        self._by_flow = {i.flow.name: i for i in self.inboxes}
        self._next = 0  # round robin, so no stream starves another

    def get(self, timeout: float | None = None) -> Received | None:
        """The next message of any inbox; None when none came within ``timeout``."""
        if len(self.inboxes) == 1:
            return self.inboxes[0].get(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = 0.0
        while True:
            for _ in self.inboxes:
                inbox = self.inboxes[self._next]
                self._next = (self._next + 1) % len(self.inboxes)
                received = inbox.get(wait)
                if received is not None:
                    return received
            if deadline is not None and time.monotonic() >= deadline:
                return None
            wait = self.POLL_S if deadline is None else min(self.POLL_S, max(0.0, deadline - time.monotonic()))

    def _of(self, received: Received) -> Inbox:
        return self._by_flow[received.envelope.flow]  # the inbox checked the flow on admission

    def reject(self, received: Received, exc: NebulaError) -> None:
        self._of(received).reject(received, exc)

    def discard_duplicate(self, received: Received) -> None:
        self._of(received).discard_duplicate(received)

    def applied(self, received: Received) -> None:
        self._of(received).applied(received)

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.close()
