"""Two hosts' supervisors of one group (``nebula_mq.launch.processes.GroupEpochs``): a restart on one is
news to the other, once; its own restart and what came before it started are not."""

from __future__ import annotations

from pathlib import Path

from nebula_mq.launch.processes import GroupEpochs


def test_a_restart_on_one_host_is_news_once_to_the_others_and_not_to_itself(tmp_path: Path) -> None:
    a, b = GroupEpochs(tmp_path, {"head"}), GroupEpochs(tmp_path, {"head", "tail"})
    assert a.moved() == [] and b.moved() == []
    a.bump("head")
    assert a.moved() == [] and b.moved() == ["head"] and b.moved() == []
    b.bump("head")
    b.bump("tail")
    assert a.moved() == ["head"] and b.moved() == []
    assert (tmp_path / "groups" / "head.epoch").read_text() == "2\n"
    assert GroupEpochs(tmp_path, {"head", "tail"}).moved() == []  # a supervisor started later: old news


def test_an_unreadable_epoch_counts_as_none_and_the_next_bump_goes_past_it(tmp_path: Path) -> None:
    (tmp_path / "groups").mkdir()
    (tmp_path / "groups" / "head.epoch").write_text("torn")
    a, b = GroupEpochs(tmp_path, {"head"}), GroupEpochs(tmp_path, {"head"})
    a.bump("head")
    assert b.moved() == ["head"] and (tmp_path / "groups" / "head.epoch").read_text() == "1\n"
