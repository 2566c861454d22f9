"""Ranks inside a replicas cluster (workers/replicas/replica.py, nebula_mq/membership/words.py)
without their group: the plan's processes and flows, what a rank other than 0 reads, rank 0's
word that it left and, with a quorum, its words that the cluster trains or skips an event, each
of one life. The ranks' training across real processes is tests/integration/test_replicas_ranks.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nebula_mq.errors import ConfigError, MalformedMessage
from nebula_mq.membership.quorum import MEMBERS
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.replicas import THREE, build, settings_for
from workers.replicas.exchange import START
from workers.replicas.outer import digest
from workers.replicas.plan import plan
from nebula_mq.membership.words import LEFT, LIFE, SKIP, TRAIN, WORD

pytestmark = pytest.mark.paddle


def test_the_plan_runs_every_rank_of_every_cluster_with_exactly_its_flows(tmp_path: Path) -> None:
    procs = plan(settings_for(tmp_path, 4, ranks=2)).processes
    assert [(p.worker_id, p.cluster, p.index, p.restart_group) for p in procs] == [
        ("replica-0", "cluster-a", 0, "replica-0"), ("replica-0-r1", "cluster-a", 1, "replica-0"),
        ("replica-1", "cluster-b", 2, "replica-1"), ("replica-1-r1", "cluster-b", 3, "replica-1"),
        ("replica-2", "cluster-c", 4, "replica-2"), ("replica-2-r1", "cluster-c", 5, "replica-2")]
    b0, b1 = procs[2], procs[3]
    assert b0.publishes == ("pseudograd-1-0", "pseudograd-1-2", "outer-1-r1")
    assert b0.consumes == ("pseudograd-0-1", "pseudograd-2-1")
    assert (b1.publishes, b1.consumes) == ((), ("outer-1-r1",))  # nothing across the WAN
    assert [p.restart_group for p in plan(settings_for(tmp_path, 4)).processes] == ["", "", ""]
    # `up --ranks r` names a rank of its cluster, whatever the cluster's place in the job.
    assert [(p.cluster, p.cluster_rank) for p in procs] == [(c, r) for c in THREE for r in (0, 1)]


def test_a_clusters_ranks_on_its_hosts_meet_at_the_first(tmp_path: Path) -> None:
    from workers.replicas.job import load_job

    job = load_job(settings_for(tmp_path, 4, ranks=2, gloo_port=29400,
                                hosts={"cluster-b": ["b1.example.org", "b2.example.org"]}))
    b = job.group_address(1)
    assert b.master == "b1.example.org:29403" and b.endpoints == ("b1.example.org:29404", "b2.example.org:29405")
    assert job.group_address(0).endpoints == ("127.0.0.1:29401", "127.0.0.1:29402")  # not named: gloo_host


@pytest.mark.parametrize(("hosts", "expected"), [
    ({"clustr-b": ["a", "b"]}, "a cluster of the job (cluster-a, cluster-b, cluster-c) (did you mean 'cluster-b'?)"),
    ({"cluster-b": ["b1"]}, "one host per rank (ranks = 2)"),
    ({"cluster-b": ["b1:22", "b2"]}, "host names or addresses, without ports"),
    ({"cluster-b": "b1"}, "an array"),
])
def test_a_wrong_hosts_table_is_one_line_naming_the_cluster(tmp_path: Path, hosts: dict[str, Any],
                                                            expected: str) -> None:
    from workers.replicas.job import load_job

    with pytest.raises(ConfigError) as info:
        load_job(settings_for(tmp_path, 4, ranks=2, hosts=hosts))
    message = str(info.value)
    assert f"replicas.hosts.{next(iter(hosts))}" in message and expected in message and "\n" not in message


def test_a_rank_other_than_0_takes_each_event_from_its_rank_0_alone(tmp_path: Path) -> None:
    """Three clusters: the rank reads one stream whatever the number of clusters."""
    rank = build(settings_for(tmp_path, 4, ranks=2), 1, MemoryBroker(), rank=1)
    assert rank.inputs().sources == ("replica-1",) and [f.name for f in rank.inputs().flows] == ["outer-1-r1"]
    here: Any = object()
    assert rank.members((None,)) is None and rank.members((here,)) == (True,)


def test_rank_0s_word_that_it_left_is_taken_only_from_its_present_life(tmp_path: Path) -> None:
    rank = build(settings_for(tmp_path, 4, ranks=2), 2, MemoryBroker(), rank=1)
    rank.told.life = 7  # agreed with rank 0 when the group starts
    settled: list[Any] = []
    inbox: Any = SimpleNamespace(settle_unordered=settled.append)
    average: Any = SimpleNamespace(meta={"start": "x"})
    assert not rank.extras().handle_other(inbox, average) and not settled  # an event's average: ordered
    old: Any = SimpleNamespace(meta={LEFT: 1, LIFE: 6})  # from before the group restarted
    assert rank.extras().handle_other(inbox, old) and settled == [old] and not rank.told.leader_left
    word: Any = SimpleNamespace(meta={LEFT: 1, LIFE: 7})  # before this rank is asked to stop: kept
    assert rank.extras().handle_other(inbox, word) and rank.told.leader_left
    assert rank.worker.agreement.leaves_alone()


class Words:
    """Rank 0's outbox of words to a rank, recording each word and how far rank 0 had trained."""

    def __init__(self, rank: Any) -> None:
        self.rank, self.sent = rank, []

    def send(self, step: int, micro_batch: int, meta: dict[str, Any]) -> None:
        self.sent.append((micro_batch, dict(meta), self.rank.trainer.trained))


def test_with_a_quorum_rank_0_says_train_before_it_trains(tmp_path: Path) -> None:
    rank0 = build(settings_for(tmp_path, 4, ranks=2, quorum=2), 1, MemoryBroker())
    rank0.trainer.life = 7
    words = Words(rank0)
    rank0.words = [words]
    rank0.produce(lambda: False)
    assert rank0.trainer.produced == 0 and rank0.trainer.trained == 5  # [replicas] inner_steps
    assert words.sent == [(0, {WORD: TRAIN, LIFE: 7}, 0)]
    rank0.produce(lambda: False)  # the same event: produced once, told once
    assert len(words.sent) == 1


def test_an_average_naming_no_members_names_every_cluster(tmp_path: Path) -> None:
    rank = build(settings_for(tmp_path, 4, ranks=2, quorum=2), 1, MemoryBroker(), rank=1)
    # Queued by a version before quorums with ranks.
    part: Any = SimpleNamespace(meta={START: digest(rank.trainer.start)})
    assert rank.members_of(part) == (0, 1, 2)


def test_with_a_quorum_a_rank_trains_or_skips_an_event_only_on_rank_0s_word_of_this_life(tmp_path: Path) -> None:
    rank = build(settings_for(tmp_path, 4, ranks=2, quorum=2), 1, MemoryBroker(), rank=1)
    rank.told.life = 7  # agreed with rank 0 when the group starts
    assert rank.inputs().sources == ("replica-1",)  # not the coordinator's choices: rank 0 reads those
    settled: list[Any] = []
    inbox: Any = SimpleNamespace(settle_unordered=settled.append)
    average: Any = object()  # an average of event 0 waiting: from this life or an earlier one
    assert not rank.told.may_train(0) and rank.members((average,)) is None  # untold: neither trains nor applies
    old: Any = SimpleNamespace(meta={WORD: TRAIN, LIFE: 6}, micro_batch=0)  # an earlier life's, still queued
    assert rank.extras().handle_other(inbox, old) and settled == [old] and not rank.told.may_train(0)
    rank.produce(lambda: False)
    assert rank.trainer.produced == -1 and rank.trainer.trained == 0
    word: Any = SimpleNamespace(meta={WORD: TRAIN, LIFE: 7}, micro_batch=0)
    assert rank.extras().handle_other(inbox, word) and rank.told.may_train(0) and rank.members((average,)) is None
    rank.trainer.produced = 0  # trained it (with rank 0: the group's collectives)
    assert rank.members((average,)) == (True,)
    skip: Any = SimpleNamespace(meta={WORD: SKIP, LIFE: 7}, micro_batch=1)
    assert rank.extras().handle_other(inbox, skip)
    rank.worker.step = 1
    assert not rank.told.may_train(1) and rank.members((average,)) == (True,)  # applied untrained
    assert rank.told.events == {1: SKIP}  # event 0's word is spent


def test_without_a_quorum_a_rank_trains_every_event_untold(tmp_path: Path) -> None:
    rank = build(settings_for(tmp_path, 4, ranks=2), 1, MemoryBroker(), rank=1)
    assert rank.told.may_train(0) and rank.told.may_train(3)


def test_the_average_carries_its_members_and_bad_members_are_malformed(tmp_path: Path) -> None:
    rank = build(settings_for(tmp_path, 4, ranks=2, quorum=2), 1, MemoryBroker(), rank=1)
    part: Any = SimpleNamespace(meta={START: digest(rank.trainer.start), MEMBERS: 0b101})
    assert rank.members_of(part) == (0, 2)  # well formed
    for bad in (0b110, 0b001, "5"):  # without the coordinator, below the quorum, not a bit set
        with pytest.raises(MalformedMessage):
            rank.extras().admit(SimpleNamespace(meta={MEMBERS: bad}))
