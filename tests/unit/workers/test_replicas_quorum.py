"""A replicas job with a quorum (workers/replicas/quorum.py): the coordinator's choice of each
event's members, logged before it is published; a job that waits below the quorum, goes on
without a cluster that is away, and a cluster that catches up from the queues and rejoins,
every replica on the same outer weights after every event."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from nebula_mq.errors import CheckpointError, ConfigError, MalformedMessage
from nebula_mq.runtime.driver import Driver
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import drivers
from tests.fixtures.replicas import THREE, Duplicates, Rounds, hooks_of, replicas, settings_for
from workers.replicas.job import ReplicasJob, load_job
from workers.replicas.quorum import Membership, members_of, read_choices

pytestmark = pytest.mark.paddle

HERE: Any = object()  # a peer's message waiting: the coordinator looks only at which are there


def started(unit: Driver, errors: list[BaseException]) -> threading.Thread:
    def go() -> None:
        try:
            unit.main()
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            errors.append(exc)
    thread = threading.Thread(target=go, daemon=True, name=unit.worker_id)
    thread.start()
    return thread


def wait_for(condition: Any, errors: list[BaseException], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert not errors and time.monotonic() < deadline, errors
        time.sleep(0.02)


def test_a_quorum_waits_goes_on_without_a_cluster_and_the_cluster_catches_up(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, steps=10, quorum=2, quorum_wait_s=0.3)
    broker = MemoryBroker()
    roles = replicas(settings, broker)
    for r in roles:
        r.worker.hooks.add(Rounds(r))
    repeats = Duplicates()
    roles[0].worker.hooks.add(repeats)
    units, errors = drivers(*roles), []
    threads = [started(units[0], errors)]
    time.sleep(1.0)  # alone, the coordinator is below the quorum of 2: it waits
    assert roles[0].worker.step == 0 and not errors
    threads.append(started(units[1], errors))
    wait_for(lambda: roles[0].worker.step >= 4, errors)  # a and b go on without c
    threads.append(started(units[2], errors))
    for t in threads:
        t.join(120.0)
        assert not t.is_alive()
    assert not errors, errors
    assert [r.worker.step for r in roles] == [10, 10, 10]

    rounds = [hooks_of(r) for r in roles]
    assert rounds[1].outer == rounds[2].outer == rounds[0].outer  # every event, c's caught-up ones too
    assert rounds[1].members == rounds[2].members == rounds[0].members  # and who took part in each
    last = max(rounds[0].model)
    assert rounds[0].model[last] == rounds[1].model[last] == rounds[2].model[last]
    members = [rounds[0].members[k] for k in sorted(rounds[0].members)]
    assert members[:4] == [2.0] * 4 and 3.0 in members[4:], members  # c left out, then back
    assert repeats.count > 0  # c's first pseudo-gradient came after its event went on: dropped
    logged = read_choices(tmp_path / "checkpoints" / "replica-0" / "quorum.jsonl")
    assert sorted(logged) == list(range(10)) and logged[0] == (0, 1)


def test_the_coordinator_chooses_each_event_once_and_a_restart_keeps_its_choice(tmp_path: Path) -> None:
    job = ReplicasJob(clusters=THREE, quorum=2, quorum_wait_s=5.0)
    now = [100.0]
    coordinator = Membership(job, 0, tmp_path, clock=lambda: now[0])
    assert coordinator.members(0, True, (HERE, None)) is None  # the wait starts
    now[0] += 4.9
    assert coordinator.members(0, True, (HERE, None)) is None
    now[0] += 0.1
    assert coordinator.members(0, True, (HERE, None)) == (0, 1)
    assert coordinator.members(1, False, (HERE, HERE)) is None  # its own is not sent yet
    assert coordinator.members(1, True, (HERE, HERE)) == (0, 1, 2)  # all there: no wait
    now[0] += 10.0
    coordinator.members(2, True, (None, None))
    now[0] += 10.0
    assert coordinator.members(2, True, (None, None)) is None  # alone is below the quorum

    restarted = Membership(job, 0, tmp_path, clock=lambda: now[0])
    assert restarted.members(0, True, (None, HERE)) is None  # its choice's member b is not back yet
    assert restarted.members(0, True, (HERE, HERE)) == (0, 1)  # c came meanwhile: still left out
    log = tmp_path / "quorum.jsonl"
    log.write_text(log.read_text() + '{"event": 2, "memb')  # cut short by a crash: never published
    assert read_choices(log) == {0: (0, 1), 1: (0, 1, 2)}
    log.write_text('{"event": 0, "memb\n{"event": 1, "members": [0, 1]}\n')
    with pytest.raises(CheckpointError, match="line 1"):
        read_choices(log)


def test_a_replica_left_out_trains_again_once_nothing_says_it_is_left_out() -> None:
    follower = Membership(ReplicasJob(clusters=THREE, quorum=2), 2, Path("unused"))
    assert follower.sources == ("quorum",) and follower.may_produce()
    follower.left_out()
    assert not follower.may_produce()
    choice: Any = type("Choice", (), {"meta": {"members": 0b011}})()
    assert follower.members(5, False, (HERE, HERE, choice)) == (0, 1)  # applied without training
    assert not follower.may_produce()
    assert follower.members(6, False, (None, None, None)) is None
    assert follower.may_produce()  # no choice waiting: it trains and sends event 6
    follower.produced()
    assert follower.members(6, True, (HERE, None, choice)) is None  # b's is still to come
    assert follower.members(6, True, (HERE, HERE, choice)) == (0, 1)


@pytest.mark.parametrize("value", [0b110, 0b001, 0, 0b1011, -1, "3", True, 3.0, None, [0, 1]])
def test_a_choice_that_is_not_members_is_malformed(value: object) -> None:
    assert members_of({"members": 0b101}, 3, 2) == (0, 2)
    with pytest.raises(MalformedMessage, match="choice of members"):
        members_of({"members": value}, 3, 2)


@pytest.mark.parametrize(("section", "key"), [({"quorum": 4}, "replicas.quorum"), ({"quorum": -1}, "replicas.quorum"),
                                              ({"quorum_wait_s": 0}, "replicas.quorum_wait_s")])
def test_a_bad_quorum_is_one_line_naming_the_key(tmp_path: Path, section: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key) as info:
        load_job(settings_for(tmp_path, 4, **section))
    assert "\n" not in str(info.value)


def test_a_quorum_adds_the_coordinators_choices_to_the_flows() -> None:
    names = [f.name for f in ReplicasJob(clusters=THREE, quorum=2).flows()]
    assert [n for n in names if n.startswith("quorum")] == ["quorum-0-1", "quorum-0-2"]
    assert len(ReplicasJob(clusters=THREE).flows()) == 6  # every cluster: no choices to send
