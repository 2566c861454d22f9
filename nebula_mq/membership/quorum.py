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
bytes). It then **catches up from the queues**: while the coordinator's choices of the next
events are waiting for it and leave it out, it applies them with the members' pseudo-gradients,
both kept in its queues, without training; once none has come for a moment (``SETTLE_S``: its
queue is drained), it trains and sends again, and the coordinator takes it in as soon as its
pseudo-gradient comes within the wait. It never downloads the weights.

With ``[replicas] coordinator = "first"`` (the default) the coordinator must be there:
without it the others wait (its checkpoint and its log resume it). With ``"elected"`` the
clusters agree on every event's members by Paxos (``election``), and a majority goes on while
any one is away. Either way, while a cluster is away every event waits ``quorum_wait_s`` for
it, and a cluster slower than the coordinator by more than that each event stays left out.
With ranks, all of this is rank 0's (the package docstring: lives and words).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from nebula_mq.errors import CheckpointError, MalformedMessage
from nebula_mq.membership import durable_log
from nebula_mq.membership.election import FLOW, Election, Send
from nebula_mq.membership.election import PRODUCER as ELECTION
from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.logs import get_logger
from nebula_mq.runtime.ordered import OrderedInbox

log = get_logger(__name__)

PRODUCER = "quorum"  # the producer of the coordinator's choices: a stream of its own
MEMBERS = "members"  # the meta key of a choice: the members as a bit set, bit c for cluster c
Members = tuple[int, ...]
# How long a replica catching up sees no choice for its next event before it trains it: the
# choices kept in its queue come within milliseconds once it reads them.
SETTLE_S = 0.1


def read_choices(path: Path) -> dict[int, Members]:
    """The choices a coordinator logged (``durable_log``: a last line cut short is cut off)."""
    choices: dict[int, Members] = {}
    for number, entry in durable_log.read(path, "a choice of members"):
        try:
            choices[int(entry["event"])] = tuple(int(c) for c in entry[MEMBERS])
        except (ValueError, KeyError, TypeError):
            raise CheckpointError(f"{path}: line {number} is not a choice of members") from None
    return choices


def bits(members: Members) -> int:
    """``members`` as a choice's bit set."""
    return sum(1 << c for c in members)


def members_of(meta: Mapping[str, Any], clusters: int, need: int, first: bool = True) -> Members:
    """The members a choice names, checked: a bit set of at least ``need`` of the ``clusters``,
    with ``first`` the coordinator's (bit 0) among them; anything else is malformed."""
    value = meta.get(MEMBERS)
    members = tuple(c for c in range(clusters) if type(value) is int and value >> c & 1)
    if type(value) is not int or not 0 < value < 1 << clusters or (first and 0 not in members) \
            or len(members) < need:
        among = ", the coordinator's (bit 0) among them" if first else ""
        raise MalformedMessage(f"a choice of members must be a bit set of at least {need} of the {clusters} "
                               f"clusters{among}: got {value!r}")
    return members


class QuorumJob(Protocol):
    """What a cluster's membership reads of its job (``workers.replicas.job.ReplicasJob`` is one)."""

    @property
    def n(self) -> int: ...  # the clusters, 0 to n - 1

    @property
    def quorum(self) -> int: ...  # the clusters an event needs, the coordinator counted; 0: all

    @property
    def quorum_wait_s(self) -> float: ...

    @property
    def coordinator_wait_s(self) -> float: ...

    @property
    def elected(self) -> bool: ...  # every event's members agreed by election

    @property
    def goes_on_without(self) -> bool: ...  # a quorum below every cluster

    def peers(self, c: int) -> tuple[int, ...]: ...


class Membership:
    """Replica ``index``'s side of the choices (see the module docstring)."""

    def __init__(self, job: QuorumJob, index: int, log_dir: Path, send: Send | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``send``: the election's messages out (rank 0's, with an elected coordinator)."""
        self.n, self.index, self.peers = job.n, index, job.peers(index)
        self.need, self.wait_s = job.quorum or job.n, job.quorum_wait_s
        self.active = job.goes_on_without
        self.election = None if send is None or not job.elected else Election(
            job.n, index, self.election_log(log_dir), job.coordinator_wait_s, send, self.check_elected, clock)
        self.senders = {FLOW.format(src=d, dst=index): d for d in self.peers}
        self.coordinator = index == 0 and not job.elected
        self.log_path = log_dir / "quorum.jsonl"
        self.chosen = read_choices(self.log_path) if self.active and self.coordinator else {}
        self.clock = clock
        self.since: dict[int, float] = {}  # event -> when the coordinator began to wait for it
        self.idle: dict[int, float] = {}  # event -> since when a replica catching up has seen no choice of it
        self.current: Members = tuple(range(self.n))  # the members of the event being applied
        self.catching_up = False  # left out of the last event: train once nothing says it is left out again
        self.go = False

    @staticmethod
    def election_log(log_dir: Path) -> Path:
        """The election's log; a replica that has checkpoints and no log lost it, and would vote
        as if it had never promised or accepted anything (Paxos's amnesia): it must not resume."""
        path = log_dir / "election.jsonl"
        if not path.exists() and CheckpointStore(log_dir).steps():
            raise CheckpointError(f"{path} is missing beside the replica's checkpoints: the election needs "
                                  "what this cluster promised and accepted (restore it, or start the job afresh)")
        return path

    def check_elected(self, value: int) -> None:
        """A bit set of members an election may name: any ``quorum`` clusters (MalformedMessage)."""
        members_of({MEMBERS: value}, self.n, self.need, first=False)

    @property
    def sources(self) -> tuple[str, ...]:
        """The streams a replica reads besides its peers': the coordinator's choices."""
        return (PRODUCER,) if self.active and not self.coordinator and self.election is None else ()

    def may_produce(self) -> bool:
        return not self.catching_up or self.go

    def produced(self) -> None:
        self.catching_up = self.go = False

    def left_out(self) -> None:
        self.catching_up, self.go = True, False

    def admit(self, received: Received) -> None:
        if received.envelope.producer == PRODUCER:
            members_of(received.meta, self.n, self.need)

    def handle_other(self, inbox: OrderedInbox, received: Received) -> bool:
        """An election message: taken into the election (what it changes is logged first) and
        acked, or dead-lettered when malformed."""
        if self.election is None or received.envelope.producer != ELECTION:
            return False
        sender = self.senders.get(received.envelope.flow)
        try:
            if sender is None:
                raise MalformedMessage(f"an election message on flow {received.envelope.flow!r}, "
                                       "which no other cluster's election uses")
            self.election.handle(sender, received.meta, received.tensors)
        except MalformedMessage as exc:
            inbox.reject(received, exc)
            return True
        inbox.settle_unordered(received)
        return True

    def members(self, event: int, produced: bool, heads: tuple[Received | None, ...]) -> Members | None:
        """Event ``event``'s members once they are known and every member's pseudo-gradient has
        come (``heads``: the peers' first messages waiting, then the choice's), else None."""
        present = {d for d, head in zip(self.peers, heads) if head is not None}
        if self.coordinator:
            chosen = self.choose(event, present | ({self.index} if produced else set()))
        elif not self.active:
            chosen = tuple(range(self.n)) if len(present) == len(self.peers) else None
        else:  # told: by the coordinator's choice (the last head), or by the election
            if self.election is not None:
                chosen = self.elect(event, produced, present)
            else:
                chosen = None if heads[-1] is None else members_of(heads[-1].meta, self.n, self.need)
            if chosen is None:
                self.settle(event)
                return None
            if self.index in chosen and not produced:  # its pseudo-gradient came from an earlier life
                self.go = True
                return None
            if not all(d in present for d in chosen if d != self.index):
                return None
        if chosen is not None:
            self.current = chosen
            self.since.pop(event, None)
            self.idle.pop(event, None)
            # Events are applied in order: an earlier one's choice is never asked for again in
            # this life (a restart reads the log), so a week-long job's choices do not pile up.
            for old in [e for e in self.chosen if e < event]:
                del self.chosen[old]
        return chosen

    def settle(self, event: int) -> None:
        """No choice for ``event`` yet: a replica catching up trains and sends once none has
        come for a moment."""
        if self.catching_up:
            self.go = self.clock() - self.idle.setdefault(event, self.clock()) >= min(SETTLE_S, self.wait_s / 5)

    def elect(self, event: int, produced: bool, present: set[int]) -> Members | None:
        """``event``'s members once decided; as the leader, proposed first (election.py)."""
        assert self.election is not None
        election = self.election
        election.poll(event, produced)
        if election.leads(event):
            pick = election.constraint(event)
            if pick is None:
                members = self.pick(event, present | ({self.index} if produced else set()))
                pick = None if members is None else bits(members)
            if pick is not None:
                election.propose(event, pick)
        decided = election.decision(event)
        return None if decided is None else tuple(c for c in range(self.n) if decided >> c & 1)

    def choose(self, event: int, present: set[int]) -> Members | None:
        """The coordinator's choice of ``event``'s members: the one it logged, or every cluster
        present once all are or once the wait is over with a quorum (then logged)."""
        logged = self.chosen.get(event)
        if logged is not None:
            return logged if present.issuperset(logged) else None
        members = self.pick(event, present)
        if members is not None and self.active:
            self.record(event, members)
        return members

    def pick(self, event: int, present: set[int]) -> Members | None:
        """Every cluster present (this one among them) once all are, or once the wait is over
        with a quorum."""
        if self.index not in present:
            return None
        if len(present) < self.n:
            if not self.active:
                return None
            waited = self.clock() - self.since.setdefault(event, self.clock())
            if waited < self.wait_s or len(present) < self.need:
                return None
            log.warning("left_out", sync_event=event, clusters=sorted(set(range(self.n)) - present), waited_s=waited)
        return tuple(sorted(present))

    def record(self, event: int, members: Members) -> None:
        """Log a choice durably before anyone is told of it."""
        self.chosen[event] = members
        durable_log.append(self.log_path, {"event": event, MEMBERS: list(members)})
