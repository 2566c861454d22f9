"""A cluster's side of each event's members (nebula_mq/membership/quorum.py), alone: the
coordinator's choice, logged before it is published; a follower that catches up; election
messages taken by the flow they come on; a lost election log. A stand-in job, a stand-in inbox
and a clock the test moves take the place of the role, the transport and the time."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from nebula_mq.errors import CheckpointError, MalformedMessage
from nebula_mq.membership.election import ACCEPT, ACCEPTED, KIND
from nebula_mq.membership.quorum import SETTLE_S, Membership, members_of, read_choices
from nebula_mq.runtime.checkpoint import CheckpointStore


@dataclass(frozen=True)
class Job:
    """Three clusters' quorum settings, as ``QuorumJob`` reads them (a ``ReplicasJob`` in a job)."""

    n: int = 3
    quorum: int = 2
    quorum_wait_s: float = 30.0
    coordinator_wait_s: float = 90.0
    elected: bool = False

    @property
    def goes_on_without(self) -> bool:
        return 0 < self.quorum < self.n

    def peers(self, c: int) -> tuple[int, ...]:
        return tuple(d for d in range(self.n) if d != c)


@dataclass
class Inbox:
    """What ``handle_other`` does with a message: acked (settled) or dead-lettered (rejected)."""

    settled: list[Any] = field(default_factory=list)
    rejected: list[tuple[Any, Exception]] = field(default_factory=list)

    def settle_unordered(self, received: Any) -> None:
        self.settled.append(received)

    def reject(self, received: Any, exc: Exception) -> None:
        self.rejected.append((received, exc))


def message(flow: str, meta: dict[str, Any], producer: str = "election") -> Any:
    return SimpleNamespace(envelope=SimpleNamespace(producer=producer, flow=flow), meta=meta, tensors={})


HERE: Any = object()  # a peer's message waiting: the coordinator looks only at which are there


def test_the_coordinator_chooses_each_event_once_and_a_restart_keeps_its_choice(tmp_path: Path) -> None:
    job = Job(quorum_wait_s=5.0)
    now = [100.0]
    coordinator = Membership(job, 0, tmp_path, clock=lambda: now[0])
    assert coordinator.members(0, True, (HERE, None)) is None  # the wait starts
    now[0] += 4.9
    assert coordinator.members(0, True, (HERE, None)) is None
    now[0] += 0.1
    assert coordinator.members(0, True, (HERE, None)) == (0, 1)
    assert coordinator.members(1, False, (HERE, HERE)) is None  # its own is not sent yet
    assert coordinator.members(1, True, (HERE, HERE)) == (0, 1, 2)  # all there: no wait
    assert set(coordinator.chosen) == {1}  # event 0's choice is in the log, not kept in memory
    now[0] += 10.0
    coordinator.members(2, True, (None, None))
    now[0] += 10.0
    assert coordinator.members(2, True, (None, None)) is None  # alone is below the quorum

    restarted = Membership(job, 0, tmp_path, clock=lambda: now[0])
    assert restarted.members(0, True, (None, HERE)) is None  # its choice's member b is not back yet
    assert restarted.members(0, True, (HERE, HERE)) == (0, 1)  # c came meanwhile: still left out
    log = tmp_path / "quorum.jsonl"
    log.write_text(log.read_text() + '{"event": 2, "memb')  # cut short by a crash: never published
    again = Membership(job, 0, tmp_path, clock=lambda: now[0])
    assert again.members(2, True, (HERE, HERE)) == (0, 1, 2)  # logged on a line of its own
    assert read_choices(log) == {0: (0, 1), 1: (0, 1, 2), 2: (0, 1, 2)}
    log.write_text('{"event": 0, "memb\n{"event": 1, "members": [0, 1]}\n')
    with pytest.raises(CheckpointError, match="line 1"):
        read_choices(log)


def test_a_replica_left_out_trains_again_once_nothing_says_it_is_left_out() -> None:
    now = [100.0]
    follower = Membership(Job(), 2, Path("unused"), clock=lambda: now[0])
    assert follower.sources == ("quorum",) and follower.may_produce()
    follower.left_out()
    assert not follower.may_produce()
    choice: Any = type("Choice", (), {"meta": {"members": 0b011}})()
    assert follower.members(5, False, (HERE, HERE, choice)) == (0, 1)  # applied without training
    assert not follower.may_produce()
    assert follower.members(6, False, (None, None, None)) is None
    assert not follower.may_produce()  # the choice may still be on its way from the queue
    now[0] += 2 * SETTLE_S
    assert follower.members(6, False, (None, None, None)) is None
    assert follower.may_produce()  # none came for a moment: it trains and sends event 6
    follower.produced()
    assert follower.members(6, True, (HERE, None, choice)) is None  # b's is still to come
    assert follower.members(6, True, (HERE, HERE, choice)) == (0, 1)


@pytest.mark.parametrize("value", [0b110, 0b001, 0, 0b1011, -1, "3", True, 3.0, None, [0, 1]])
def test_a_choice_that_is_not_members_is_malformed(value: object) -> None:
    assert members_of({"members": 0b101}, 3, 2) == (0, 2)
    with pytest.raises(MalformedMessage, match="choice of members"):
        members_of({"members": value}, 3, 2)


def test_a_cluster_that_lost_its_election_log_does_not_resume(tmp_path: Path) -> None:
    job = Job(elected=True)
    CheckpointStore(tmp_path).save(4, {"w": np.zeros(2, np.float32)})
    with pytest.raises(CheckpointError, match="election.jsonl is missing"):
        Membership(job, 1, tmp_path, send=lambda *_: None)
    (tmp_path / "election.jsonl").write_text('{"promise": 1}\n')
    assert Membership(job, 1, tmp_path, send=lambda *_: None).election is not None


def test_election_messages_are_known_by_their_flow_and_the_malformed_dead_lettered(tmp_path: Path) -> None:
    """Cluster b takes a's proposal of event 0 from the flow a alone publishes on, accepts it,
    tells the others, and decides (a's vote and its own are a majority of three). The same
    proposal on c's flow, or on a flow no election uses, is a dead letter."""
    sent: list[tuple[int, dict[str, Any]]] = []
    b = Membership(Job(elected=True), 1, tmp_path, send=lambda dst, meta, _: sent.append((dst, dict(meta))))
    assert b.election is not None and b.sources == ()  # no coordinator's choices to read
    proposal = {KIND: ACCEPT, "event": 0, "epoch": 0, "members": 0b011}
    inbox = Inbox()
    for flow in ("elect-2-1", "elect-1-1", "pseudograd-0-1"):
        assert b.handle_other(inbox, message(flow, proposal))
    assert [type(exc) for _, exc in inbox.rejected] == [MalformedMessage] * 3 and not sent
    assert not b.handle_other(inbox, message("pseudograd-0-1", {}, producer="replica-0"))  # ordered
    accepted = message("elect-0-1", proposal)
    assert b.handle_other(inbox, accepted) and inbox.settled == [accepted]
    assert [(dst, meta[KIND]) for dst, meta in sent] == [(0, ACCEPTED), (2, ACCEPTED)]
    assert b.members(0, True, (HERE, None)) == (0, 1)  # decided: a's part is here, c's is not needed
    assert '"decide": 0' in (tmp_path / "election.jsonl").read_text()
