"""An elected coordinator for a replicas quorum (``[replicas] coordinator = "elected"``): any
cluster may choose an event's members, so the job goes on while the one that chose them is away.

Each event's members are agreed by Paxos, the clusters its acceptors. Epoch ``e``'s leader,
cluster ``e % n``, proposes (``accept``); a cluster that accepts tells every other
(``accepted``); each decides the event once a majority has accepted the same members in the
same epoch. No two clusters ever decide an event differently, whoever proposed and whatever was
lost. With three clusters a follower decides as it accepts, the leader a round trip later.

A cluster that has waited ``coordinator_wait_s`` for a decision (up to half as long again,
drawn at random as in Raft, so that clusters seldom give up together) goes to the epoch past
the newest it has heard of: it promises to accept nothing older and tells every cluster what it
has accepted (``view``). A cluster that hears of it joins if it has waited half as long itself,
if it leads the epoch, or if the epoch's leader tells it. The leader, once a majority has
promised, proposes for each event the members accepted in the highest epoch among them, or
chooses afresh where none was: the rule that keeps any choice that may have been decided. A
cluster behind the one it tells is sent the decisions it lacks (``decided``); otherwise the
messages kept in its queues tell it. A leader that restarts asks for the promises again.

What a cluster promised, accepted and decided is fsynced to ``election.jsonl`` before it says
so (it must never lose it: ``quorum`` refuses to resume without it). Votes are not logged: a
cluster that restarts learns what it lacks from the answers to its view. With two clusters the
one left cannot tell a cut from a death: the config needs three.
"""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from nebula_mq.errors import CheckpointError, MalformedMessage, WorkerError
from nebula_mq.membership import durable_log
from nebula_mq.runtime.logs import get_logger

log = get_logger(__name__)

PRODUCER = "election"  # the producer of election messages, on the flows FLOW names
FLOW = "elect-{src}-{dst}"  # the flow of cluster src's election messages to cluster dst
KIND = "elect"  # their meta key: what the message is
ACCEPT, ACCEPTED, VIEW, DECIDED = "accept", "accepted", "view", "decided"
ENTRIES = "entries"  # a view's accepted (event, epoch, members) rows; decided's members, in order
MAX_ENTRIES = 4096  # decisions sent in one message: a cluster further behind asks again

# (destination cluster, meta, int64 arrays): one election message, published after the log holds
# what it says.
Send = Callable[[int, Mapping[str, Any], Mapping[str, np.ndarray]], None]


class Election:
    """Cluster ``index``'s part in agreeing every event's members (see the module docstring).
    ``check`` refuses a members bit set that no choice could name (a MalformedMessage)."""

    def __init__(self, n: int, index: int, log_path: Path, wait_s: float, send: Send,
                 check: Callable[[int], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.n, self.index, self.wait_s, self.send, self.check, self.clock = n, index, wait_s, send, check, clock
        self.majority = n // 2 + 1
        self.log_path = log_path
        self.promised = 0  # no proposal of an older epoch is accepted; epoch 0 is cluster 0's
        self.accepted: dict[int, tuple[int, int]] = {}  # event -> (epoch, members), from event next on
        self.prefix = array("q")  # the members of events 0..next-1, all decided
        self.later: dict[int, int] = {}  # decided events beyond a gap
        self.votes: dict[tuple[int, int, int], set[int]] = {}  # (event, epoch, members) -> clusters
        self.views: dict[int, dict[int, tuple[int, np.ndarray]]] = {}  # epoch -> cluster -> (next, rows)
        self.proposed: dict[int, int] = {}  # event -> the epoch this cluster proposed it in, as leader
        self.waiting: dict[int, float] = {}  # event -> when this cluster began to wait for its decision
        self.rng = random.Random(index)
        self.patience = wait_s * (1 + self.rng.random() / 2)  # this wait's, drawn again after each
        for number, record in durable_log.read(log_path, "an election record"):
            try:
                self._replay({str(k): int(v) for k, v in record.items()})
            except (ValueError, TypeError, AttributeError, KeyError):
                raise CheckpointError(f"{log_path}: line {number} is not an election record") from None
        for event, (epoch, members) in self.accepted.items():  # the votes it had are gone; its own stands
            self.votes.setdefault((event, epoch, members), set()).add(index)
        # A leader of a later epoch that restarts has lost the promises it held: it asks again
        # (the clusters of its epoch answer its view with theirs).
        self.ask = self.promised > 0 and self.promised % n == index

    def _replay(self, entry: dict[str, int]) -> None:
        if "promise" in entry:
            self.promised = max(self.promised, entry["promise"])
        elif "accept" in entry:  # accepting promised its epoch too
            self.promised = max(self.promised, entry["epoch"])
            self.accepted[entry["accept"]] = (entry["epoch"], entry["members"])
        else:
            self._decided(entry["decide"], entry["members"])

    # ------------------------------------------------------------------ what is known

    @property
    def next(self) -> int:
        """The first event not decided here."""
        return len(self.prefix)

    def decision(self, event: int) -> int | None:
        """The members ``event`` was decided with (a bit set), or None while it is not."""
        return int(self.prefix[event]) if event < self.next else self.later.get(event)

    def leads(self, event: int) -> bool:
        """Whether this cluster is to propose ``event``'s members now: it leads the epoch it
        promised, a majority has promised it too, and nobody has decided further than it has."""
        e = self.promised
        if e % self.n != self.index or self.decision(event) is not None or self.proposed.get(event) == e:
            return False
        if e == 0:  # the first epoch: nothing older can have been chosen
            return True
        views = self.views.get(e, {})
        return len(views) >= self.majority and event >= max(nxt for nxt, _ in views.values())

    def constraint(self, event: int) -> int | None:
        """The members accepted in the highest epoch among the promises of the leader's epoch:
        what it must propose for ``event`` (None: free to choose)."""
        mine = self.accepted.get(event)
        if mine is not None and mine[0] == self.promised:  # proposed in this epoch before a restart
            return mine[1]
        best: tuple[int, int] | None = None
        for _, rows in self.views.get(self.promised, {}).values():
            for ev, epoch, members in rows.tolist():
                if ev == event and (best is None or epoch > best[0]):
                    best = (epoch, members)
        return None if best is None else best[1]

    # ------------------------------------------------------------------ acting

    def propose(self, event: int, members: int) -> None:
        """As leader: ``members`` for ``event``, accepted here first, then sent to every cluster."""
        e = self.promised
        self.proposed[event] = e
        self._accept(event, e, members)
        log.info("proposed", sync_event=event, epoch=e, members=members)
        self._broadcast({KIND: ACCEPT, "event": event, "epoch": e, "members": members})

    def poll(self, event: int, waiting: bool) -> None:
        """Called while this cluster waits to apply ``event`` (``waiting``: its own part is sent):
        after ``coordinator_wait_s`` with no decision, it goes to a newer epoch."""
        if self.ask:
            self.ask = False
            self.views.setdefault(self.promised, {})[self.index] = (self.next, self._open_rows())
            self._broadcast_view()
        if not waiting or self.decision(event) is not None:
            return
        now = self.clock()
        if now - self.waiting.setdefault(event, now) < self.patience:
            return
        newest = max([self.promised, *self.views]) + 1
        log.warning("coordinator_away", sync_event=event, epoch=self.promised, leader=self.promised % self.n,
                    new_epoch=newest, new_leader=newest % self.n, waited_s=round(self.patience, 3))
        self._promise(newest)

    def handle(self, sender: int, meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> None:
        """One election message from cluster ``sender``; malformed ones raise MalformedMessage."""
        kind = meta.get(KIND)
        if kind == DECIDED:
            first = self._ints(meta, "event")
            for offset, m in enumerate(self._rows(tensors, 1)[:, 0].tolist()):
                self._decide(first + offset, self._members(m))
            return
        event, epoch = self._ints(meta, "event"), self._ints(meta, "epoch")
        if kind == VIEW:
            rows = self._rows(tensors, 3)
            for m in rows[:, 2].tolist():
                self._members(m)
            self._viewed(sender, epoch, event, rows)
            return
        members = self._members(meta.get("members"))
        if kind == ACCEPT:
            if sender != epoch % self.n:
                raise MalformedMessage(f"cluster {sender} proposed in epoch {epoch}, led by cluster {epoch % self.n}")
            self._vote(event, epoch, members, sender)
            if self.decision(event) is not None:
                self._tell_decided(sender, event)  # a leader that restarted behind the others
            elif epoch >= self.promised:
                self._accept(event, epoch, members)
                self._broadcast({KIND: ACCEPTED, "event": event, "epoch": epoch, "members": members})
            else:  # an old leader: it learns the newer epoch from this cluster's promise
                self._send_view(sender)
        elif kind == ACCEPTED:
            self._vote(event, epoch, members, sender)
        else:
            raise MalformedMessage(f"election message of kind {kind!r}: one of {[ACCEPT, ACCEPTED, VIEW, DECIDED]}")

    # ------------------------------------------------------------------ the protocol's steps

    def _promise(self, epoch: int) -> None:
        durable_log.append(self.log_path, {"promise": epoch})
        self.promised = epoch
        self.waiting[self.next] = self.clock()  # the new leader's turn: a whole wait before the next
        self.patience = self.wait_s * (1 + self.rng.random() / 2)
        self.views.setdefault(epoch, {})[self.index] = (self.next, self._open_rows())
        for old in [e for e in self.views if e < epoch]:
            del self.views[old]
        self._broadcast_view()

    def _broadcast_view(self) -> None:
        for d in range(self.n):
            if d != self.index:
                self._send_view(d)

    def _send_view(self, dst: int) -> None:
        self.send(dst, {KIND: VIEW, "event": self.next, "epoch": self.promised}, {ENTRIES: self._open_rows()})

    def _open_rows(self) -> np.ndarray:
        # Every event accepted from the first not decided on, decided or not: a leader that
        # has decided less must not choose afresh what a majority may have decided.
        rows = [(ev, e, m) for ev, (e, m) in sorted(self.accepted.items())]
        if len(rows) > MAX_ENTRIES:  # one event is in flight at a time: a log that says otherwise is wrong
            raise WorkerError(f"{self.log_path}: {len(rows)} events accepted from event {self.next} on, none "
                              f"decided: more than a view holds ({MAX_ENTRIES})")
        return np.array(rows, np.int64).reshape(-1, 3)

    def _viewed(self, sender: int, epoch: int, nxt: int, rows: np.ndarray) -> None:
        if nxt < self.next:
            self._tell_decided(sender, nxt)
        if epoch < self.promised:
            return
        self.views.setdefault(epoch, {})[sender] = (nxt, rows)
        leader = epoch % self.n
        if epoch == self.promised and sender == leader != self.index:
            self._send_view(sender)  # its leader restarted and asks for the promises again
        since = self.waiting.get(self.next)
        waited = since is not None and self.clock() - since >= self.wait_s / 2
        if epoch > self.promised and (waited or leader in (sender, self.index)):
            self._promise(epoch)  # it has waited long too, or the epoch's leader is there: it joins

    def _accept(self, event: int, epoch: int, members: int) -> None:
        durable_log.append(self.log_path, {"accept": event, "epoch": epoch, "members": members})
        self.promised = max(self.promised, epoch)
        self.accepted[event] = (epoch, members)
        self._vote(event, epoch, members, self.index)

    def _vote(self, event: int, epoch: int, members: int, voter: int) -> None:
        if self.decision(event) is not None:
            return
        voters = self.votes.setdefault((event, epoch, members), set())
        voters.add(voter)
        if len(voters) >= self.majority:
            self._decide(event, members)

    def _decide(self, event: int, members: int) -> None:
        known = self.decision(event)
        if known is not None:
            if known != members:  # Paxos rules it out: a bug, or a log edited by hand
                raise WorkerError(f"event {event} decided with members {known:#b} and {members:#b}")
            return
        durable_log.append(self.log_path, {"decide": event, "members": members})
        self._decided(event, members)
        log.info("decided", sync_event=event, members=members)

    def _decided(self, event: int, members: int) -> None:
        self.later[event] = members
        while self.next in self.later:
            self.prefix.append(self.later.pop(self.next))
        for old in [k for k in self.votes if self.decision(k[0]) is not None]:
            del self.votes[old]
        for ev in [ev for ev in self.accepted if ev < self.next]:
            del self.accepted[ev]
        self.waiting.pop(event, None)
        self.proposed.pop(event, None)

    def _tell_decided(self, dst: int, first: int) -> None:
        last = min(self.next, first + MAX_ENTRIES)
        if first < last:
            members = np.array(self.prefix[first:last], np.int64).reshape(-1, 1)
            self.send(dst, {KIND: DECIDED, "event": first}, {ENTRIES: members})

    def _broadcast(self, meta: Mapping[str, Any]) -> None:
        for d in range(self.n):
            if d != self.index:
                self.send(d, meta, {})

    # ------------------------------------------------------------------ checks of what comes in

    @staticmethod
    def _ints(meta: Mapping[str, Any], key: str) -> int:
        value = meta.get(key)
        if type(value) is not int or value < 0:
            raise MalformedMessage(f"election message's {key!r} must be an integer >= 0: got {value!r}")
        return value

    def _members(self, value: Any) -> int:
        if type(value) is not int:
            raise MalformedMessage(f"election message's members must be a bit set: got {value!r}")
        self.check(value)
        return value

    @staticmethod
    def _rows(tensors: Mapping[str, np.ndarray], width: int) -> np.ndarray:
        rows = tensors.get(ENTRIES)
        if rows is None or rows.dtype != np.int64 or rows.ndim != 2 or rows.shape[1] != width \
                or len(rows) > MAX_ENTRIES or (rows < 0).any():
            raise MalformedMessage(f"election message's {ENTRIES!r} must be at most {MAX_ENTRIES} rows of "
                                   f"{width} integers >= 0")
        return rows
