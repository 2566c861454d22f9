"""What a transport's publishers look at while they wait, so that a wait can end early.

A publisher waits for room in its window and for confirms (``window``), and while the broker
blocks publishing (a resource alarm) or no longer answers, those waits can be long. Each turn of
them calls the transport's :class:`WaitChecks`: the alarm's stop check (``alarm.BrokerAlarm``),
and whatever a worker adds, e.g. its inbox's watch for a broker that lost the job
(``runtime.lost_broker``): a worker waiting for a confirm from such a broker would otherwise wait
out ``publish_patience_s``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class WaitChecks:
    """What a publisher's waits (for room in the window, for a confirm) call at each turn; any
    check may raise to end the wait. One per transport, shared by its publishers; thread-safe."""

    def __init__(self, *checks: Callable[[], None]) -> None:
        """``checks`` run in every thread's waits."""
        self._lock = threading.Lock()
        self._checks: list[tuple[int | None, Callable[[], None]]] = [(None, c) for c in checks]

    def add(self, check: Callable[[], None]) -> Callable[[], None]:
        """Call ``check`` in the waits of the calling thread from now on (a training thread's
        check must not raise in, say, a status publisher's wait); returns its remover."""
        entry = (threading.get_ident(), check)
        with self._lock:
            self._checks.append(entry)

        def remove() -> None:
            with self._lock:
                if entry in self._checks:
                    self._checks.remove(entry)

        return remove

    def __call__(self) -> None:
        me = threading.get_ident()
        with self._lock:
            checks = [check for thread, check in self._checks if thread in (None, me)]
        for check in checks:
            check()
