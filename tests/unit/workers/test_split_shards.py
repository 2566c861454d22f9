"""Data-parallel ranks of a split job: how a micro-batch is cut, which flows and broker
permissions each rank gets, and the settings that describe them. (Ranks training together
on the real stack: tests/integration/test_split_ranks.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nebula_mq.errors import ConfigError, DataError
from nebula_mq.settings import JobSettings, Settings, load_settings
from workers.abnet.job import load_job
from workers.plans import plan_for
from workers.split.job import load_split_job
from workers.split.shards import Ranks, piece, rank_id


@pytest.mark.parametrize(("heads", "tails"), [(1, 1), (2, 1), (1, 2), (2, 2), (3, 2), (4, 4)])
def test_every_sample_of_a_micro_batch_goes_to_exactly_one_head_and_one_tail_rank(heads: int, tails: int) -> None:
    ranks, batch = Ranks(heads, tails), 48
    rows = np.arange(batch)
    seen: dict[int, list[int]] = {j: [] for j in range(tails)}
    for i in range(heads):
        shard = rows[ranks.shard(batch, i)]
        assert len(shard) == batch // heads
        for j in range(tails):
            seen[j] += list(shard[piece(len(shard), tails, j)])  # tail rank j's piece of the shard
    assert sorted(r for piece in seen.values() for r in piece) == list(range(batch))
    assert {len(piece) for piece in seen.values()} == {batch // tails}  # equal shares: the mean holds


def test_a_batch_that_does_not_divide_into_equal_pieces_is_a_data_error() -> None:
    with pytest.raises(DataError, match="multiple of 4"):
        Ranks(2, 2).shard(10, 0)


def test_rank_0_keeps_the_single_process_id() -> None:
    assert [rank_id("enc-0", r) for r in range(3)] == ["enc-0", "enc-0-r1", "enc-0-r2"]


def split_settings(**split: object) -> Settings:
    return Settings(job=JobSettings(id="ranks", scenario="split"), split={"head": "m:h", "tail": "m:t", **split})


def test_each_rank_may_touch_exactly_its_flows_and_a_side_restarts_as_one_group() -> None:
    plan = plan_for(split_settings(head_ranks=2, tail_ranks=2))
    by_id = {p.worker_id: p for p in plan.processes}
    assert sorted(by_id) == ["head-0", "head-0-r1", "tail-0", "tail-0-r1"]
    assert sorted(f.name for f in plan.flows) == ["activations-0", "activations-1", "reply-head-0",
                                                  "reply-head-0-r1"]
    assert by_id["head-0-r1"].publishes == ("activations-0", "activations-1")
    assert by_id["head-0-r1"].consumes == ("reply-head-0-r1",)
    assert by_id["tail-0"].consumes == ("activations-0",)
    assert by_id["tail-0"].publishes == ("reply-head-0", "reply-head-0-r1")
    assert {p.restart_group for p in plan.processes} == {"head", "tail"}
    assert [(p.role, p.index) for p in plan.processes if p.worker_id.endswith("-r1")] == [
        ("split-tail", 1), ("split-head", 1)]  # `nebula-mq worker --index` is the rank


def test_one_rank_a_side_is_the_single_process_job() -> None:
    plan = plan_for(split_settings())
    assert [f.name for f in plan.flows] == ["activations", "reply-head-0"]
    assert all(p.restart_group == "" for p in plan.processes)


def test_abnet_spells_the_ranks_encoder_ranks_and_decoder_ranks(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[job]\nid = "r"\nscenario = "abnet"\n[abnet]\nencoder_ranks = 2\ndecoder_ranks = 4\n'
                   'batch_size = 16\n')
    parsed = load_job(load_settings(job, environ={}))
    assert (parsed.head_ranks, parsed.tail_ranks) == (2, 4)
    assert len(plan_for(load_settings(job, environ={})).processes) == 6


@pytest.mark.parametrize(("section", "match"), [
    ('encoder_ranks = 2\ndecoder_ranks = 2\nbatch_size = 6', "multiple of encoder_ranks x decoder_ranks"),
    ('encoder_ranks = 0', "head_ranks >= 1"),
    ('head_device = "tpu"', "head_device"),
    ('encoder_ranks = 2\nhead_ranks = 2', "one of encoder_ranks and head_ranks"),
])
def test_bad_rank_settings_are_one_line_config_errors(tmp_path: Path, section: str, match: str) -> None:
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\nid = "r"\nscenario = "abnet"\n[abnet]\n{section}\n')
    with pytest.raises(ConfigError, match=match):
        load_job(load_settings(job, environ={}))


def test_a_device_the_settings_do_not_know_is_a_config_error(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[job]\nid = "r"\ndevice = "cuda0"\n')
    with pytest.raises(ConfigError, match="device"):
        load_settings(job, environ={})
    assert load_split_job(split_settings(tail_device="gpu:1")).tail_device == "gpu:1"
