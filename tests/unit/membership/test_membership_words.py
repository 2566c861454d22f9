"""membership.words alone: the life a cluster's group agrees on, and what a rank other than 0
takes of its rank 0's words (the roles that send and read them: tests/unit/workers/test_replicas_rank_plan.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from nebula_mq.membership.words import LEFT, LIFE, NO_LIFE, SKIP, TRAIN, WORD, Told, agree_life


class Group:
    """A group's MIN over this rank and a peer that gives ``peer``."""

    def __init__(self, peer: int) -> None:
        self.peer = peer

    def min_int(self, value: int) -> int:
        return min(value, self.peer)

    def barrier(self) -> None:
        """Not used."""


def test_rank_0_draws_the_life_and_every_rank_learns_it() -> None:
    life = agree_life(Group(NO_LIFE), 0)
    assert 0 <= life < NO_LIFE and agree_life(Group(life), 1) == life


def test_a_word_counts_only_in_its_life_and_an_event_is_trained_or_skipped_as_told() -> None:
    told = Told(needs_word=True)
    told.life = 7
    settled: list[Any] = []
    inbox: Any = SimpleNamespace(settle_unordered=settled.append)

    def said(meta: dict[str, Any], event: int = 0) -> Any:
        return SimpleNamespace(meta=meta, micro_batch=event)

    def word(said: str, life: int) -> dict[str, Any]:
        return {WORD: said, LIFE: life}

    def left(life: int) -> dict[str, Any]:
        return {LEFT: 1, LIFE: life}

    assert not told.handle_other(inbox, said({"start": "x"})) and not settled  # an average: ordered
    assert told.handle_other(inbox, said(word(TRAIN, 6))) and not told.may_train(0)  # an earlier life's
    assert told.handle_other(inbox, said(left(6))) and not told.leader_left
    assert told.handle_other(inbox, said(word(TRAIN, 7))) and told.may_train(0) and not told.may_apply(0, False)
    assert told.may_apply(0, trained=True)
    assert told.handle_other(inbox, said(word(SKIP, 7), 1)) and told.may_apply(1, False) and not told.may_train(1)
    assert told.events == {1: SKIP}  # event 0's word is spent
    assert told.handle_other(inbox, said(left(7))) and told.leader_left
    assert len(settled) == 5  # every word is settled, whatever its life


def test_without_a_quorum_a_rank_needs_no_word() -> None:
    told = Told(needs_word=False)
    assert told.may_train(3) and told.may_apply(3, trained=False)
