"""A replicas job with an elected coordinator (``[replicas] coordinator = "elected"``): what the
config allows, and three replicas that go on while the first coordinator is away. The election
itself is tested alone in tests/unit/membership/test_membership_election.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from nebula_mq.config import InvalidField
from nebula_mq.runtime.hold import HOLD_FILE_ENV, set_hold
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import drivers
from tests.fixtures.replicas import Rounds, StopAfterSending, build, hooks_of, replicas, settings_for
from tests.fixtures.threads import started, wait_for
from workers.replicas.job import ReplicasJob


def test_an_elected_coordinator_needs_three_clusters_a_quorum_and_a_longer_wait() -> None:
    three = ("a", "b", "c")
    ReplicasJob(clusters=three, quorum=2, coordinator="elected").validate()
    for job, match in [(ReplicasJob(clusters=("a", "b"), quorum=1, coordinator="elected"), "three clusters"),
                       (ReplicasJob(clusters=three, coordinator="elected"), "quorum below"),
                       (ReplicasJob(clusters=three, quorum=2, coordinator="elected", coordinator_wait_s=30.0),
                        "above quorum_wait_s"),
                       (ReplicasJob(clusters=three, quorum=2, coordinator="electd"), "did you mean 'elected'")]:
        with pytest.raises(InvalidField, match=match):
            job.validate()
    elected = ReplicasJob(clusters=three, quorum=2, coordinator="elected")
    assert [f.name for f in elected.incoming(0)] == ["pseudograd-1-0", "pseudograd-2-0", "elect-1-0", "elect-2-0"]
    assert "quorum-0-1" not in [f.name for f in elected.flows()]


@pytest.mark.paddle
def test_the_job_goes_on_while_its_first_coordinator_is_away_and_it_catches_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three replicas, ``coordinator = "elected"``: a (the first epoch's leader) stops after it
    sends event 3. b and c wait for event 3's choice, elect b, and go on without a up to a step
    hold at event 8; a, started again, learns every choice from its queues and catches up to
    the hold, and once it is lifted takes part again. Every replica agrees on every event's
    members and outer weights."""
    hold = tmp_path / "hold"
    monkeypatch.setenv(HOLD_FILE_ENV, str(hold))  # read as each driver is made
    set_hold(hold, 8)
    settings = settings_for(tmp_path, steps=11, quorum=2, quorum_wait_s=1.0, coordinator="elected",
                            coordinator_wait_s=2.0)
    broker = MemoryBroker()
    roles = replicas(settings, broker)
    for r in roles:
        r.worker.hooks.add(Rounds(r))
    roles[0].worker.hooks.add(StopAfterSending(roles[0].worker, 3))
    units, errors = drivers(*roles), []
    threads = [started(unit, errors) for unit in units]
    threads[0].join(60.0)
    assert not threads[0].is_alive() and roles[0].worker.step <= 3, errors
    wait_for(lambda: min(r.worker.step for r in roles[1:]) == 8, errors)
    roles[0] = build(settings, 0, broker)
    roles[0].worker.hooks.add(Rounds(roles[0]))
    threads.append(started(drivers(roles[0])[0], errors))
    wait_for(lambda: roles[0].worker.step == 8, errors)
    set_hold(hold, None)
    for t in threads[1:]:
        t.join(120.0)
        assert not t.is_alive()
    assert not errors, errors
    assert [r.worker.step for r in roles] == [11, 11, 11]
    rounds = [hooks_of(r) for r in roles]
    steps = sorted(rounds[0].outer)  # a's since it came back: from event 3 or 4 (its checkpoint) on
    assert steps[0] <= 5 and all(rounds[0].outer[k] == rounds[1].outer[k] == rounds[2].outer[k] for k in steps)
    assert rounds[1].members == rounds[2].members and all(rounds[0].members[k] == rounds[1].members[k] for k in steps)
    members = [rounds[1].members[k] for k in sorted(rounds[1].members)]  # event by event
    assert members[4:8] == [2.0] * 4 and 3.0 in members[8:], members  # a left out, then back
    for c in (1, 2):  # both moved on from a's epoch
        assert '"promise"' in (tmp_path / "checkpoints" / f"replica-{c}" / "election.jsonl").read_text()
