"""A replicas job with a quorum (nebula_mq/membership/quorum.py, tested alone in
tests/unit/membership): a job that waits below the quorum, goes on without a cluster that is
away, and a cluster that catches up from the queues and rejoins, every replica on the same
outer weights after every event; a replica left out ends the event the same trained or not."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from nebula_mq.errors import ConfigError
from nebula_mq.membership.quorum import read_choices
from nebula_mq.runtime.hold import HOLD_FILE_ENV, set_hold
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import drivers
from tests.fixtures.replicas import THREE, Duplicates, Rounds, build, hooks_of, replicas, settings_for
from tests.fixtures.threads import started, wait_for
from workers.replicas.exchange import START
from workers.replicas.job import ReplicaSpec, ReplicasJob, load_job
from workers.replicas.outer import digest

pytestmark = pytest.mark.paddle


def test_a_quorum_waits_goes_on_without_a_cluster_and_the_cluster_catches_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """a and b go on without c to a step hold at event 4; c, started then, catches up from the
    queues to the hold, and once it is lifted the three train each event from the same moment:
    c's first pseudo-gradient comes while a still runs, whichever thread is faster."""
    hold = tmp_path / "hold"
    monkeypatch.setenv(HOLD_FILE_ENV, str(hold))  # read as each driver is made
    set_hold(hold, 4)
    settings = settings_for(tmp_path, steps=10, quorum=2, quorum_wait_s=1.0)
    broker = MemoryBroker()
    inner_steps: list[int] = []  # c's

    def counted(settings: Any, index: int) -> ReplicaSpec:
        from mlp_replicas import build_replica

        spec = build_replica(settings, index)

        def batch(shard: int, step: int) -> Any:
            if shard == 2:
                inner_steps.append(step)
            return spec.batch(shard, step)
        return ReplicaSpec(spec.model, spec.loss, batch)

    roles = replicas(settings, broker, counted)
    for r in roles:
        r.worker.hooks.add(Rounds(r))
    repeats = Duplicates()
    roles[0].worker.hooks.add(repeats)
    units, errors = drivers(*roles), []
    threads = [started(units[0], errors)]
    time.sleep(1.0)  # alone, the coordinator is below the quorum of 2: it waits
    assert roles[0].worker.step == 0 and not errors
    threads.append(started(units[1], errors))
    wait_for(lambda: min(r.worker.step for r in roles[:2]) == 4, errors)  # a and b go on without c
    threads.append(started(units[2], errors))
    wait_for(lambda: roles[2].worker.step == 4, errors)  # c caught up from the queues
    set_hold(hold, None)
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
    skipped = sum(1 for e in range(10) if not any(5 * e <= t < 5 * e + 5 for t in inner_steps))
    assert skipped >= 2, sorted(set(inner_steps))  # events it caught up on without training
    logged = read_choices(tmp_path / "checkpoints" / "replica-0" / "quorum.jsonl")
    assert sorted(logged) == list(range(10)) and logged[0] == (0, 1)


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


def peer_parts(start: dict[str, np.ndarray], event: int) -> tuple[Any, ...]:
    """Replicas 0's and 1's pseudo-gradients of ``event`` as the driver hands them over (decoded)."""
    parts = []
    for d in (0, 1):
        rng = np.random.default_rng([event, d])
        tensors = {k: (rng.standard_normal(v.shape) * 1e-2).astype(np.float32) for k, v in start.items()}
        parts.append(SimpleNamespace(envelope=SimpleNamespace(producer=f"replica-{d}"), meta={START: digest(start)},
                                     tensors=tensors))
    return tuple(parts)


def test_a_left_out_replica_ends_the_event_the_same_whether_it_trained_or_not(tmp_path: Path) -> None:
    """Whether a replica catching up saw the coordinator's choice before it would train is a
    matter of timing: the event must leave it in the same state either way (weights, inner
    optimizer, error feedback), or a replay would send other bytes under the same ids. Event 0
    with every cluster, event 1 without replica 2 (trained, or not), then event 2 sent."""
    states = []
    for trained in (True, False):
        replica = build(settings_for(tmp_path / str(trained), steps=4, quorum=2), 2, MemoryBroker())
        replica.open()
        try:
            replica.produce(lambda: False)
            replica.membership.current = (0, 1, 2)
            replica.apply(peer_parts(replica.trainer.start, 0))
            replica.worker.step = 1
            if not trained:
                replica.membership.left_out()  # catching up: the choice is there before it trains
            replica.produce(lambda: False)
            assert (replica.trainer.produced, replica.trainer.trained) == ((1, 10) if trained else (-1, 5))
            replica.membership.current = (0, 1)
            values = replica.apply(peer_parts(replica.trainer.start, 1))
            assert values["members"] == 2.0 and replica.trainer.trained == 10
            replica.worker.step = 2
            replica.membership.go = True  # no choice came for its next event: it trains
            replica.produce(lambda: False)  # event 2, sent again after a replay: the same bytes
            assert replica.trainer.produced == 2
            states.append(replica.state()[0])
        finally:
            replica.close()
    assert states[0].keys() == states[1].keys(), set(states[0]) ^ set(states[1])
    for k in states[0]:
        np.testing.assert_array_equal(states[0][k], states[1][k], err_msg=k)
