"""Who takes part in each sync event of a replicas job that may go on without a cluster
(``[replicas] quorum`` below the number of clusters).

The first cluster's replica is the **coordinator**. For each event it waits for every other
cluster's pseudo-gradient; once ``quorum_wait_s`` have passed since it sent its own, and at
least ``quorum`` clusters' have come (its own counted), it goes on with those. That choice,
the event's **members**, is appended to a log beside its checkpoints and fsynced before it is
published to every other cluster as the event's message on ``quorum-0-<d>``: a coordinator
that restarts finds what it chose and never chooses an event twice. Every other replica
applies an event once the coordinator's choice and every member's pseudo-gradient have come.
So every replica averages the same decoded pseudo-gradients in the same order, and all hold
bit-identical outer weights after every event.

A cluster left out of an event (cut off, stopped, slow) takes the event's outer weights
whole and its inner optimizer and error feedback go back to where they were before it trained
the event: what it trained is dropped with its pseudo-gradient, which comes late everywhere
and is dropped as a repeat, and its state after the event is the same whether or not it
trained (whether it saw the choice in time is a matter of timing; a replay must send the same
bytes). It then **catches up from the queues**: while the
coordinator's choices of the next events are waiting for it and leave it out, it applies
them with the members' pseudo-gradients, both kept in its queues, without training; once
none has come for a moment (``SETTLE_S``: its queue is drained), it trains and sends again, and the coordinator takes it in as soon as its
pseudo-gradient comes within the wait. It never downloads the weights.

With ranks inside a cluster (``workers.replicas.ranks``) all of this is rank 0's; the others
train an event on its word and learn the event's members from its average.

The coordinator must be there: without it the others wait (its checkpoint and its log
resume it). While a cluster is away every event waits ``quorum_wait_s`` for it, and a cluster
slower than the coordinator by more than that each event stays left out.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nebula_mq.errors import CheckpointError, MalformedMessage
from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.logs import get_logger
from workers.replicas.job import ReplicasJob

log = get_logger(__name__)

PRODUCER = "quorum"  # the producer of the coordinator's choices: a stream of its own
MEMBERS = "members"  # the meta key of a choice: the members as a bit set, bit c for cluster c
Members = tuple[int, ...]
# How long a replica catching up sees no choice for its next event before it trains it: the
# choices kept in its queue come within milliseconds once it reads them.
SETTLE_S = 0.1


def read_choices(path: Path) -> dict[int, Members]:
    """The choices a coordinator logged; a last line cut short by a crash was never published,
    and is cut off the file here, so the next choice starts a line of its own."""
    if not path.exists():
        return {}
    text = path.read_bytes()
    if text and not text.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(text.rfind(b"\n") + 1)
            os.fsync(f.fileno())
    choices: dict[int, Members] = {}
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            choices[int(entry["event"])] = tuple(int(c) for c in entry[MEMBERS])
        except (ValueError, KeyError, TypeError):
            if number < len(lines):
                raise CheckpointError(f"{path}: line {number} is not a choice of members") from None
    return choices


def bits(members: Members) -> int:
    """``members`` as a choice's bit set."""
    return sum(1 << c for c in members)


def members_of(meta: Mapping[str, Any], clusters: int, need: int) -> Members:
    """The members a choice names, checked: a bit set of at least ``need`` of the ``clusters``,
    the coordinator's (bit 0) among them; anything else is malformed."""
    value = meta.get(MEMBERS)
    members = tuple(c for c in range(clusters) if type(value) is int and value >> c & 1)
    if type(value) is not int or not 0 < value < 1 << clusters or 0 not in members or len(members) < need:
        raise MalformedMessage(f"a choice of members must be a bit set of at least {need} of the {clusters} "
                               f"clusters, the coordinator's (bit 0) among them: got {value!r}")
    return members


class Membership:
    """Replica ``index``'s side of the choices (see the module docstring)."""

    def __init__(self, job: ReplicasJob, index: int, log_dir: Path,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.n, self.index, self.peers = job.n, index, job.peers(index)
        self.need, self.wait_s = job.quorum or job.n, job.quorum_wait_s
        self.active = job.goes_on_without
        self.coordinator = index == 0
        self.log_path = log_dir / "quorum.jsonl"
        self.chosen = read_choices(self.log_path) if self.active and self.coordinator else {}
        self.clock = clock
        self.since: dict[int, float] = {}  # event -> when the coordinator began to wait for it
        self.current: Members = tuple(range(self.n))  # the members of the event being applied
        self.catching_up = False  # left out of the last event: train once nothing says it is left out again
        self.go = False

    @property
    def sources(self) -> tuple[str, ...]:
        """The streams a replica reads besides its peers': the coordinator's choices."""
        return (PRODUCER,) if self.active and not self.coordinator else ()

    def may_produce(self) -> bool:
        return not self.catching_up or self.go

    def produced(self) -> None:
        self.catching_up = self.go = False

    def left_out(self) -> None:
        self.catching_up, self.go = True, False

    def admit(self, received: Received) -> None:
        if received.envelope.producer == PRODUCER:
            members_of(received.meta, self.n, self.need)

    def members(self, event: int, produced: bool, heads: tuple[Received | None, ...]) -> Members | None:
        """Event ``event``'s members once they are known and every member's pseudo-gradient has
        come (``heads``: the peers' first messages waiting, then the choice's), else None."""
        present = {d for d, head in zip(self.peers, heads) if head is not None}
        if self.coordinator:
            chosen = self.choose(event, present | ({self.index} if produced else set()))
        elif not self.active:
            chosen = tuple(range(self.n)) if len(present) == len(self.peers) else None
        elif heads[-1] is None:
            if self.catching_up:  # no choice for this event for a moment: train and send
                self.go = self.clock() - self.since.setdefault(event, self.clock()) >= min(SETTLE_S, self.wait_s / 5)
            return None
        else:
            chosen = members_of(heads[-1].meta, self.n, self.need)
            if self.index in chosen and not produced:  # its pseudo-gradient came from an earlier life
                self.go = True
                return None
            if not all(d in present for d in chosen if d != self.index):
                return None
        if chosen is not None:
            self.current = chosen
            self.since.pop(event, None)
            # Events are applied in order: an earlier one's choice is never asked for again in
            # this life (a restart reads the log), so a week-long job's choices do not pile up.
            for old in [e for e in self.chosen if e < event]:
                del self.chosen[old]
        return chosen

    def choose(self, event: int, present: set[int]) -> Members | None:
        """The coordinator's choice of ``event``'s members: the one it logged, or every cluster
        present once all are or once the wait is over with a quorum (then logged)."""
        logged = self.chosen.get(event)
        if logged is not None:
            return logged if present.issuperset(logged) else None
        if self.index not in present:
            return None
        if len(present) < self.n:
            if not self.active:
                return None
            waited = self.clock() - self.since.setdefault(event, self.clock())
            if waited < self.wait_s or len(present) < self.need:
                return None
            log.warning("left_out", sync_event=event, clusters=sorted(set(range(self.n)) - present), waited_s=waited)
        members = tuple(sorted(present))
        if self.active:
            self.record(event, members)
        return members

    def record(self, event: int, members: Members) -> None:
        """Log a choice durably (the file, and its directory entry when new) before anyone is
        told of it."""
        self.chosen[event] = members
        new = not self.log_path.exists()
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, MEMBERS: list(members)}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if new:
            directory = os.open(self.log_path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
