"""The elected coordinator (nebula_mq/membership/election.py): Paxos over every event's members.

A simulated network delivers the clusters' messages in a random order, late, and to clusters
that crash and restart from their logs; whoever leads proposes members of its own choosing.
No two clusters may ever decide an event differently, and a majority that stays up decides
every event."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq.errors import CheckpointError, MalformedMessage
from nebula_mq.membership.election import ACCEPT, ACCEPTED, DECIDED, ENTRIES, KIND, VIEW, Election
from nebula_mq.membership.quorum import MEMBERS, members_of

WAIT_S = 5.0
Message = tuple[int, int, dict[str, Any], dict[str, np.ndarray]]  # (from, to, meta, arrays)


class Net:
    """``n`` clusters' elections, their messages held until delivered, on one clock."""

    def __init__(self, root: Path, n: int, need: int = 1) -> None:
        self.root, self.n, self.need = root, n, need
        self.now = 0.0
        self.queued: list[Message] = []
        self.nodes: list[Election | None] = [self.start(i) for i in range(n)]

    def start(self, i: int) -> Election:
        def send(dst: int, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
            self.queued.append((i, dst, dict(meta), {k: np.array(v) for k, v in arrays.items()}))
        (self.root / str(i)).mkdir(exist_ok=True)
        return Election(self.n, i, self.root / str(i) / "election.jsonl", WAIT_S, send,
                        lambda m: members_of({MEMBERS: m}, self.n, self.need, first=False), lambda: self.now)

    def node(self, i: int) -> Election:
        node = self.nodes[i]
        assert node is not None
        return node

    def deliver(self, k: int = 0) -> None:
        src, dst, meta, arrays = self.queued.pop(k)
        node = self.nodes[dst]
        if node is None:  # a cluster that is down: its queue keeps the message
            self.queued.append((src, dst, meta, arrays))
            return
        node.handle(src, meta, arrays)

    def deliver_all(self, to: int | None = None) -> None:
        for _ in range(10_000):
            ready = [k for k, m in enumerate(self.queued) if self.nodes[m[1]] is not None and to in (None, m[1])]
            if not ready:
                return
            self.deliver(ready[0])
        raise AssertionError("the messages never settle")


def full(n: int) -> int:
    return (1 << n) - 1


def test_the_first_epochs_leader_proposes_and_a_follower_decides_as_it_accepts(tmp_path: Path) -> None:
    net = Net(tmp_path, 3)
    a, b, c = (net.node(i) for i in range(3))
    assert a.leads(0) and not b.leads(0) and not c.leads(0)
    a.propose(0, 0b011)
    assert not a.leads(0)  # proposed once in its epoch
    assert [(m[1], m[2][KIND]) for m in net.queued] == [(1, ACCEPT), (2, ACCEPT)]
    net.deliver(0)  # to b: b's acceptance and a's make a majority of three
    assert b.decision(0) == 0b011 and a.decision(0) is None
    net.deliver_all()
    assert a.decision(0) == c.decision(0) == 0b011 and a.next == 1


def test_the_others_elect_the_next_cluster_when_the_leader_is_away(tmp_path: Path) -> None:
    """a goes away before it proposes event 0; b and c wait, go to epoch 1 (led by b), and b
    chooses. a, back from its log, learns the choice and the epoch from its queue."""
    net = Net(tmp_path, 3)
    b, c = net.node(1), net.node(2)
    net.nodes[0] = None
    for node in (b, c):
        node.poll(0, True)
    net.now += WAIT_S - 0.1
    c.poll(0, True)
    assert c.promised == 0  # not yet
    net.now += WAIT_S / 2 + 0.1  # the longest a cluster waits (its patience is drawn at random)
    c.poll(0, True)
    assert c.promised == 1 and not c.leads(0)
    net.deliver_all()  # b has waited as long: on c's promise it joins c's epoch, which it leads
    assert b.promised == 1 and b.leads(0) and b.constraint(0) is None
    b.propose(0, 0b110)
    net.deliver_all()
    assert b.decision(0) == c.decision(0) == 0b110
    net.nodes[0] = a = net.start(0)  # back: its queue holds everything said meanwhile
    net.deliver_all()
    assert a.decision(0) == 0b110 and a.promised == 1 and not a.leads(1)


def test_a_new_leader_keeps_a_choice_only_one_cluster_accepted(tmp_path: Path) -> None:
    net = Net(tmp_path, 5)
    a = net.node(0)
    a.propose(0, 0b00111)
    net.queued = [m for m in net.queued if m[1] == 1]  # b alone gets a's proposal, and accepts it
    net.nodes[0] = None
    net.deliver_all()
    assert all(net.node(i).decision(0) is None for i in range(1, 5))
    for i in range(1, 5):
        net.node(i).poll(0, True)
    net.now += 1.5 * WAIT_S
    for i in range(1, 5):
        net.node(i).poll(0, True)
    net.deliver_all()
    b = net.node(1)
    assert b.leads(0) and b.constraint(0) == 0b00111
    b.propose(0, 0b00111)
    net.deliver_all()
    assert {net.node(i).decision(0) for i in range(1, 5)} == {0b00111}


def test_a_leader_that_restarts_proposes_again_what_it_logged(tmp_path: Path) -> None:
    net = Net(tmp_path, 3)
    net.node(0).propose(0, 0b011)
    net.queued.clear()  # lost with the crash (never confirmed)
    net.nodes[0] = again = net.start(0)
    assert again.leads(0) and again.constraint(0) == 0b011


def test_a_cluster_behind_is_told_the_decisions_it_lacks(tmp_path: Path) -> None:
    """c was away longer than the replay window: the messages kept for it are refused as too
    old. Once it has waited for its leader, its promise is answered with the decisions."""
    net = Net(tmp_path, 3)
    net.nodes[2] = None
    for event in range(3):
        net.node(0).propose(event, 0b011)
        net.deliver_all()
    net.queued = [m for m in net.queued if m[1] != 2]
    c = net.nodes[2] = net.start(2)
    c.poll(0, True)
    net.now += 1.5 * WAIT_S
    c.poll(0, True)
    net.deliver_all()
    assert c.next == 3 and [c.decision(e) for e in range(3)] == [0b011] * 3


def test_a_restart_keeps_the_epoch_an_acceptance_promised_and_its_own_vote(tmp_path: Path) -> None:
    """a accepts b's proposal of epoch 1 (no promise of its own logged). Restarted, it still
    refuses epoch 0: it neither leads epoch 0 again nor accepts an older proposal."""
    net = Net(tmp_path, 5)
    net.node(0).handle(1, {KIND: ACCEPT, "event": 0, "epoch": 1, "members": 0b00110}, {})
    net.queued.clear()
    a = net.nodes[0] = net.start(0)
    assert a.promised == 1 and not a.leads(0)
    assert a.votes[(0, 1, 0b00110)] == {0}
    a.handle(2, {KIND: ACCEPTED, "event": 0, "epoch": 1, "members": 0b00110}, {})
    a.handle(3, {KIND: ACCEPTED, "event": 0, "epoch": 1, "members": 0b00110}, {})
    assert a.decision(0) == 0b00110  # its own vote, kept over the restart, made the third


def test_the_next_epochs_leader_joins_at_once_and_the_old_leader_follows(tmp_path: Path) -> None:
    """c gives up on a alone (a is slow, not gone) and goes to epoch 1: b, its leader, joins as
    soon as it hears, and so does a once b tells it. A proposal of epoch 0 that comes late is
    refused, and answered with a promise that names the epoch."""
    net = Net(tmp_path, 3)
    a, b, c = (net.node(i) for i in range(3))
    c.poll(0, True)
    net.now += 1.5 * WAIT_S
    c.poll(0, True)
    net.deliver_all()
    assert b.promised == a.promised == 1 and b.leads(0) and not a.leads(0)
    c.handle(0, {KIND: ACCEPT, "event": 0, "epoch": 0, "members": 0b111}, {})
    assert c.accepted == {} and net.queued[-1][1:3] == (0, {KIND: VIEW, "event": 0, "epoch": 1})
    net.queued.clear()
    b.propose(0, 0b110)
    net.deliver_all()
    assert {node.decision(0) for node in (a, b, c)} == {0b110}


def test_a_leader_that_restarts_asks_for_the_promises_again(tmp_path: Path) -> None:
    net = Net(tmp_path, 3)
    c = net.node(2)
    c.poll(0, True)
    net.now += 1.5 * WAIT_S
    c.poll(0, True)
    net.deliver_all()
    assert net.node(1).leads(0)
    b = net.nodes[1] = net.start(1)
    assert b.promised == 1 and not b.leads(0)  # its promises were not logged
    b.poll(0, False)
    net.deliver_all()
    assert b.leads(0)


def test_a_leader_behind_learns_what_was_decided_before_it_chooses(tmp_path: Path) -> None:
    """c, replaced with no log while a and b decided events 0-2, comes to lead an epoch: b has
    decided further, so c waits for b's answer instead of choosing event 0 afresh."""
    net = Net(tmp_path, 3)
    net.nodes[2] = None
    for event in range(3):
        net.node(0).propose(event, 0b011)
        net.deliver_all()
    net.queued = [m for m in net.queued if m[1] != 2]  # c's queue went with it
    net.nodes[0] = None
    c = net.nodes[2] = net.start(2)
    c.poll(0, True)
    net.now += WAIT_S
    c.handle(1, {KIND: VIEW, "event": 3, "epoch": 2}, {ENTRIES: np.zeros((0, 3), np.int64)})
    assert c.promised == 2 and not c.leads(0)  # it joined b's epoch, which it leads: not yet
    net.deliver_all()  # c's promise reaches b, whose answer holds the decisions
    assert [c.decision(e) for e in range(3)] == [0b011] * 3 and c.leads(3)


def test_election_messages_are_checked(tmp_path: Path) -> None:
    net = Net(tmp_path, 3, need=2)
    b = net.node(1)
    bad: list[tuple[dict[str, Any], dict[str, np.ndarray], str]] = [
        ({KIND: "vote", "event": 0, "epoch": 0, "members": 3}, {}, "kind"),
        ({KIND: ACCEPT, "event": 0, "epoch": 1, "members": 3}, {}, "led by cluster 1"),
        ({KIND: ACCEPT, "event": -1, "epoch": 0, "members": 3}, {}, "'event'"),
        ({KIND: ACCEPTED, "event": 0, "epoch": 0, "members": 1}, {}, "at least 2"),
        ({KIND: ACCEPTED, "event": 0, "epoch": 0, "members": 8}, {}, "bit set"),
        ({KIND: ACCEPTED, "event": 0, "epoch": 0, "members": "3"}, {}, "bit set"),
        ({KIND: VIEW, "event": 0, "epoch": 1}, {ENTRIES: np.zeros((1, 2), np.int64)}, ENTRIES),
        ({KIND: VIEW, "event": 0, "epoch": 1}, {ENTRIES: np.array([[0, 0, 1]], np.int64)}, "at least 2"),
        ({KIND: DECIDED, "event": 0}, {ENTRIES: np.array([[3.0]])}, ENTRIES),
    ]
    for meta, arrays, match in bad:
        with pytest.raises(MalformedMessage, match=match):
            b.handle(0, meta, arrays)
    assert b.decision(0) is None and b.promised == 0


def test_the_log_survives_a_crash_mid_line_and_refuses_a_damaged_one(tmp_path: Path) -> None:
    net = Net(tmp_path, 3)
    net.node(0).propose(0, 0b111)
    net.deliver_all()
    log = tmp_path / "1" / "election.jsonl"
    log.write_text(log.read_text() + '{"decide": 1, "mem')
    again = net.start(1)
    assert again.decision(0) == 0b111 and again.next == 1 and log.read_text().endswith("\n")
    log.write_text('{"accept": 0, "ep\n' + log.read_text())
    with pytest.raises(CheckpointError, match="line 1"):
        net.start(1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.sampled_from([3, 4, 5]))
def test_no_two_clusters_ever_decide_an_event_differently(tmp_path_factory: pytest.TempPathFactory,
                                                          seed: int, n: int) -> None:
    """Random delivery, messages redelivered, clusters crashing (what they sent and the broker
    had not confirmed is lost) and restarting from their logs, never more than a minority down,
    leaders proposing members of their own random choosing: every event that any two clusters
    decide, they decide alike, and no cluster accepts above what it promised; with a majority
    up, all of them decide every event."""
    rng = random.Random(seed)
    net = Net(tmp_path_factory.mktemp("net"), n)
    events, down_at_most = 6, n - (n // 2 + 1)
    seen: dict[int, int] = {}
    for _ in range(3000):
        net.now += rng.choice([0.0, 0.5, 2.0])
        if rng.random() < 0.01:
            down = [i for i in range(n) if net.nodes[i] is None]
            if down and (rng.random() < 0.5 or len(down) >= down_at_most):
                i = rng.choice(down)
                net.nodes[i] = net.start(i)
            elif len(down) < down_at_most:
                i = rng.choice([i for i in range(n) if net.nodes[i] is not None])
                net.nodes[i] = None
                net.queued = [m for m in net.queued if m[0] != i or rng.random() < 0.5]
        for node in net.nodes:
            if node is None or node.next >= events:
                continue
            node.poll(node.next, True)
            if node.leads(node.next):
                pick = node.constraint(node.next)
                node.propose(node.next, pick if pick is not None else rng.randrange(1, full(n) + 1))
        for _ in range(rng.randrange(0, 4)):
            ready = [k for k, m in enumerate(net.queued) if net.nodes[m[1]] is not None]
            if ready:
                k = rng.choice(ready)
                if rng.random() < 0.05:  # redelivered after it was handled
                    net.queued.append(net.queued[k])
                net.deliver(k)
        for node in net.nodes:
            assert node is None or all(e <= node.promised for e, _ in node.accepted.values())
            for event in range(node.next if node else 0):
                assert node is not None and seen.setdefault(event, node.decision(event) or 0) == node.decision(event)
        if all(node is not None and node.next >= events for node in net.nodes):
            break
    for i in range(n):  # everyone back, every message delivered, the clocks run on
        net.nodes[i] = net.nodes[i] or net.start(i)
    for _ in range(200):  # a leader proposes as soon as it may; the others wait for it
        if all(net.node(i).next >= events for i in range(n)):
            break
        for node in map(net.node, range(n)):
            if node.next < events and node.leads(node.next):
                pick = node.constraint(node.next)
                node.propose(node.next, pick if pick is not None else full(n))
        net.deliver_all()
        net.now += WAIT_S / 10  # messages come much sooner than a cluster gives up on its leader
        for node in map(net.node, range(n)):
            node.poll(node.next, True)
        net.deliver_all()
    for i in range(n):
        assert net.node(i).next >= events, (i, net.node(i).next)
        assert [net.node(i).decision(e) for e in range(events)] == [seen.get(e, net.node(0).decision(e))
                                                                     for e in range(events)]
