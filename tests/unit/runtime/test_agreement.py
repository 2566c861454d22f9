"""runtime.agreement: what a worker agrees with its group (here a recording stand-in for the
group's collectives; the real groups run in tests/integration/test_split_ranks.py, test_chaos.py
and test_electra_e2e.py)."""

from __future__ import annotations

import numpy as np
import pytest

from nebula_mq.errors import CheckpointError
from nebula_mq.runtime.agreement import IDLE_POLLS_TO_STOP, Agreement
from nebula_mq.runtime.signals import StopFlag


class Peers:
    """Collectives over this rank and peers whose latest checkpoints are ``others``."""

    def __init__(self, *others: int) -> None:
        self.others, self.barriers = others, 0

    def min_int(self, value: int) -> int:
        return min(value, *self.others)

    def barrier(self) -> None:
        self.barriers += 1


def test_alone_a_worker_resumes_from_its_latest_checkpoint_and_stops_when_asked() -> None:
    stop = StopFlag()
    alone = Agreement(stop)
    assert alone.start_step([10, 20], "w") == 20 and alone.start_step([], "w") is None
    assert not alone.stopping() and alone.may_checkpoint()
    stop.set()
    assert alone.stopping(idle_polls=0)
    alone.before_ack()  # nothing to wait for


def test_a_group_resumes_from_the_lowest_latest_checkpoint_of_its_ranks() -> None:
    assert Agreement(StopFlag(), Peers(10, 30)).start_step([10, 20, 30], "head-0") == 10
    assert Agreement(StopFlag(), Peers(-1)).start_step([10], "head-0") is None  # a rank has none: start over
    with pytest.raises(CheckpointError, match=r"head-0 has no checkpoint at its group's step 10 \(it has \[20, 30\]\)"):
        Agreement(StopFlag(), Peers(10)).start_step([20, 30], "head-0")


class Summed:
    """A step's collective over this rank and peers that give ``peers``; records what this rank gave."""

    def __init__(self, *peers: list[float]) -> None:
        self.peers = peers
        self.given: list[list[float]] = []

    def __call__(self, values: list[float]) -> np.ndarray:
        self.given.append(values)
        return np.sum([values, *self.peers], axis=0)


def test_a_group_stops_where_any_rank_voted_and_a_rank_leaves_alone_only_when_idle() -> None:
    stop = StopFlag()
    group = Agreement(stop, Peers())
    quiet = Summed([2.5, 0.0])
    assert list(group.voted(quiet, 1.5)) == [4.0]  # the riders come back summed, the votes counted
    assert quiet.given == [[1.5, 0.0]]  # this rank's vote rides last
    assert not group.stopping() and not group.may_checkpoint()
    group.voted(Summed([1.0]))  # a peer asked to stop: every rank stops after this step
    assert group.stopping() and group.may_checkpoint()

    asked = Agreement(stop, Peers())
    stop.set()
    voting = Summed([0.0])
    asked.voted(voting)
    assert voting.given == [[1.0]]
    asked = Agreement(stop, Peers())  # asked, and no step came since
    assert not asked.stopping(idle_polls=IDLE_POLLS_TO_STOP - 1)  # its peers may still need this step
    assert asked.stopping(idle_polls=IDLE_POLLS_TO_STOP) and not asked.may_checkpoint()  # leaving alone: no barrier


def test_a_rank_waiting_for_another_ranks_word_leaves_alone_only_after_it() -> None:
    stop, word = StopFlag(), [False]
    follower = Agreement(stop, Peers(), leaves_alone=lambda: word[0])
    stop.set()
    assert not follower.stopping(idle_polls=IDLE_POLLS_TO_STOP + 5)  # its rank 0 may still enter a collective
    word[0] = True
    assert follower.stopping(idle_polls=IDLE_POLLS_TO_STOP) and not follower.may_checkpoint()


def test_a_group_acks_only_after_the_barrier() -> None:
    peers = Peers()
    Agreement(StopFlag(), peers).before_ack()
    assert peers.barriers == 1
