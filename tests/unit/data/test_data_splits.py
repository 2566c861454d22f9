"""Splits by source: whole groups go to one split, deterministically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq.data.parallel import SPLITS, ParallelPair, SplitFractions, assign_groups, cap_splits, write_parallel
from nebula_mq.errors import DataError

sizes_strategy = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=6), st.integers(1, 500), min_size=3, max_size=40)


@settings(max_examples=60, deadline=None)
@given(sizes_strategy, st.integers(0, 2**31))
def test_every_group_lands_in_one_split_and_held_out_splits_are_filled(sizes: dict[str, int], seed: int) -> None:
    where = assign_groups(sizes, SplitFractions(), seed)
    assert set(where) == set(sizes)
    assert set(where.values()) <= set(SPLITS)
    assert "train" in where.values()
    for split in ("valid", "test"):
        assert split in where.values()
    # Reordering the mapping changes nothing.
    assert assign_groups(dict(reversed(list(sizes.items()))), SplitFractions(), seed) == where


def test_held_out_share_stays_near_its_fraction() -> None:
    sizes = {f"g{i}": 10 + (i * 37) % 90 for i in range(200)}
    total = sum(sizes.values())
    where = assign_groups(sizes, SplitFractions(valid=0.05, test=0.1), seed=3)
    share = {s: sum(n for g, n in sizes.items() if where[g] == s) / total for s in SPLITS}
    assert 0.07 <= share["test"] <= 0.15
    assert 0.03 <= share["valid"] <= 0.075


def test_seeds_give_different_but_reproducible_splits() -> None:
    sizes = {f"g{i}": 20 for i in range(60)}
    a, b = assign_groups(sizes, SplitFractions(), 1), assign_groups(sizes, SplitFractions(), 2)
    assert a == assign_groups(sizes, SplitFractions(), 1)
    assert a != b


def test_bad_fractions_are_a_data_error() -> None:
    with pytest.raises(DataError):
        SplitFractions(valid=0.6, test=0.5)


def test_cap_splits_shrinks_all_splits_alike() -> None:
    by_split = {"train": list(range(900)), "valid": list(range(50)), "test": list(range(50))}
    capped = cap_splits(by_split, 100, seed=0)
    assert sum(map(len, capped.values())) <= 100
    assert len(capped["train"]) == 90 and len(capped["test"]) == 5
    assert capped["train"] == sorted(capped["train"])  # original order kept
    assert cap_splits(by_split, 100, seed=0) == capped


def _pairs(domain: str, groups: int, per_group: int) -> list[ParallelPair]:
    return [
        ParallelPair(f"{domain}-src-{g}-{i}", f"tgt-{g}-{i}", domain, f"{domain}{g}")
        for g in range(groups)
        for i in range(per_group)
    ]


def test_written_splits_share_no_source_and_no_group(tmp_path: Path) -> None:
    shared = ParallelPair("gettext-src-0-0", "other translation", "bible", "bible0")  # same source, other domain
    domains = {"gettext": _pairs("gettext", 30, 7), "bible": [shared, *_pairs("bible", 20, 11)]}
    section = write_parallel(tmp_path / "parallel", tmp_path, domains, fractions=SplitFractions(), seed=5, max_pairs=None)
    rows = {s: [json.loads(x) for x in (tmp_path / "parallel" / f"{s}.jsonl").read_text().splitlines()] for s in SPLITS}
    sources = {s: {r["src"] for r in rows[s]} for s in SPLITS}
    groups = {s: {(r["domain"], r["group"]) for r in rows[s]} for s in SPLITS}
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1 :]:
            assert not sources[a] & sources[b]
            assert not groups[a] & groups[b]
    assert sum(len(r) for r in rows.values()) == 30 * 7 + 20 * 11  # the duplicate source went once
    assert section["counts"]["bible"]["test"] == sum(r["domain"] == "bible" for r in rows["test"])
    assert section["files"]["test"]["rows"] == len(rows["test"])
