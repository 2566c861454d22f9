"""A role's inbox, watched for a broker that came back without the job (``transport.job_presence``).

While the inbox's consumers are connected, nothing happens here. Once they have been without
a connection for :data:`DOWN_GRACE_S`, the watch asks the broker, every :data:`PROBE_EVERY_S`,
whether it still holds the job: an outage (the broker stopped, the link down) answers nothing
and the wait goes on, as long as it lasts. A broker that refuses the job's login
:data:`CONFIRMATIONS` times in a row lost the job's data: whatever it held (the messages the
role waits for) is gone, no reconnect will bring them, and the role stops with one
:class:`~nebula_mq.errors.BrokerDataLost` that names the cluster, the worker, what it needs and
where to read how to recover.

A broker wiped and provisioned again before the worker (re)starts admits its login but holds
nothing of what the job had put there. At the inbox's opening the watch therefore compares the
broker's incarnation markers (``transport.job_presence``) with the one noted beside the
worker's checkpoints (:data:`INCARNATION_FILE`): the noted one missing is the same loss, and
the same error. The first opening with no checkpoint notes the broker's oldest marker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nebula_mq import topology
from nebula_mq.atomic import disk_problem, write_json_atomic
from nebula_mq.errors import BrokerDataLost, CheckpointError
from nebula_mq.transport.base import Consumer
from nebula_mq.transport.job_presence import transport_incarnations, transport_job_gone

if TYPE_CHECKING:
    from nebula_mq.runtime.worker import Worker

# Seconds without a connection before the broker is asked (a reconnect takes well under one).
DOWN_GRACE_S = 3.0
# Seconds between two looks at the broker while the consumers stay disconnected.
PROBE_EVERY_S = 2.0
# Refusals in a row that make a loss (one refusal could be a broker still starting its vhosts).
CONFIRMATIONS = 2
# Where the docs say how to recover.
RECOVERY = "see docs/faults.md: Recovering a broker that lost its data"

# Beside a worker's checkpoints: the broker incarnation they were made with.
INCARNATION_FILE = "broker-incarnation.json"

Probe = Callable[[], "str | None"]
Markers = Callable[[], "list[str] | None"]


class BrokerWatch:
    """Watches ``consumers`` (all on the worker's broker); :meth:`check` raises once the broker
    is found without the job. ``probe`` and ``clock`` default to the real broker and time."""

    def __init__(self, worker: Worker, consumers: Sequence[Consumer], probe: Probe | None = None,
                 clock: Callable[[], float] = time.monotonic, markers: Markers | None = None) -> None:
        self.worker = worker
        self.consumers = list(consumers)
        self.probe: Probe = probe if probe is not None else (lambda: transport_job_gone(worker.transport))
        self.markers: Markers = markers if markers is not None else (lambda: transport_incarnations(worker.transport))
        self.clock = clock
        self.down_since: float | None = None
        self.next_probe = 0.0
        self.refusals = 0

    def connected(self) -> bool:
        # A consumer that does not say (the in-memory transport's) is always connected.
        return all(getattr(c, "connected", True) for c in self.consumers)

    def check(self, needs: Callable[[], str]) -> None:
        """Called while the role waits; ``needs`` says what the role waits for (only called
        when the broker lost it)."""
        if self.connected():
            self.down_since, self.refusals = None, 0
            return
        now = self.clock()
        if self.down_since is None:
            self.down_since, self.next_probe = now, now + DOWN_GRACE_S
            return
        if now < self.next_probe:
            return
        gone = self.probe()
        self.next_probe = self.clock() + PROBE_EVERY_S
        self.refusals = self.refusals + 1 if gone is not None else 0
        if gone is not None and self.refusals >= CONFIRMATIONS:
            raise BrokerDataLost(self.message(gone, needs()))

    def opened(self, needs: Callable[[], str]) -> None:
        """At the inbox's opening: raise when the broker is not the incarnation the worker's
        checkpoints were made with; note it when the worker has no checkpoint (or no note)."""
        found = self.markers()
        if found is None:  # the broker cannot say (no management API): only the watch applies
            return
        path = self.worker.store.root / INCARNATION_FILE
        noted = _noted(path)
        if noted and self.worker.store.steps():
            if noted not in found:
                vhost = topology.vhost(self.worker.settings.job.id)
                raise BrokerDataLost(self.message(
                    f"vhost {vhost} was provisioned again since {self.worker.worker_id}'s checkpoints: its "
                    f"incarnation {noted} is gone, the broker has {', '.join(found) or 'none'}", needs()))
            return
        if found:
            try:
                write_json_atomic(path, {"incarnation": found[0], "cluster": self.worker.cluster})
            except OSError as exc:  # the checkpoint directory's disk: its checkpoints would fail too
                raise CheckpointError(f"cannot note the broker's incarnation in {path}: {disk_problem(exc)}") from None

    def message(self, gone: str, needs: str) -> str:
        w = self.worker
        steps = w.store.steps()
        checkpoint = f"its last checkpoint is step {steps[-1]}" if steps else "it has no checkpoint"
        return (f"{w.cluster}'s broker lost the job's data ({gone}): {w.worker_id} needs {needs} "
                f"({checkpoint}); they are on no broker any more, and the producers' checkpoints count "
                f"them as sent: re-provision the job and start it over ({RECOVERY})")


def _noted(path: Path) -> str:
    """The incarnation noted in ``path`` ("" when none is, or the note is unreadable)."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(body.get("incarnation", "")) if isinstance(body, dict) else ""
