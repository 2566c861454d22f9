"""The es→en parallel corpus: gettext catalogues and the Bible, split by source.

Rows are ``{"src", "tgt", "domain", "group"}``: ``domain`` is what BLEU is
reported by (``gettext``, ``bible``), ``group`` the unit of the split (a
catalogue such as ``git`` or ``libreoffice/svx``, a book such as ``Gen``).

The split is by source, so no test sentence has a sibling in training: a group is
never divided. Groups are shuffled with the seed and dealt to the held-out splits
until each holds about its fraction of the rows; everything else trains.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from nebula_mq.data import catalogues as cat
from nebula_mq.data.bible import VersePair
from nebula_mq.data.corpus_io import FileRecord, InputReport, write_jsonl
from nebula_mq.errors import DataError

T = TypeVar("T")

SPLITS = ("train", "valid", "test")
HELD_OUT = ("test", "valid")


@dataclass(frozen=True)
class SplitFractions:
    valid: float = 0.05
    test: float = 0.05
    # A held-out split may exceed its share by this factor to take one more whole group.
    slack: float = 1.5

    def __post_init__(self) -> None:
        if not (0 <= self.valid < 1 and 0 <= self.test < 1 and self.valid + self.test < 1):
            raise DataError(f"split fractions must be in [0, 1) and sum below 1, got {self}")


def assign_groups(sizes: Mapping[str, int], fractions: SplitFractions, seed: int) -> dict[str, str]:
    """Group name → split name, deterministic for a seed (independent of mapping order)."""
    names = sorted(sizes)
    random.Random(seed).shuffle(names)
    total = sum(sizes.values())
    caps = {
        "test": max(1, math.ceil(fractions.test * total * fractions.slack)) if fractions.test else 0,
        "valid": max(1, math.ceil(fractions.valid * total * fractions.slack)) if fractions.valid else 0,
    }
    filled = {"test": 0, "valid": 0}
    position = {name: i for i, name in enumerate(names)}
    out: dict[str, str] = {}
    for name in names:
        out[name] = "train"
        # The emptiest held-out split (relative to its cap) gets first pick.
        for split in sorted(HELD_OUT, key=lambda s: filled[s] / caps[s] if caps[s] else math.inf):
            if filled[split] + sizes[name] <= caps[split]:
                out[name] = split
                filled[split] += sizes[name]
                break
    if "train" not in out.values() and names:
        out[max(names, key=lambda n: (sizes[n], n))] = "train"
    # Every group larger than the caps: still hold out the smallest ones, if training keeps one.
    for split in HELD_OUT:
        if caps[split] and filled[split] == 0:
            # Smallest first; among equals, the seed's shuffled order decides.
            train = sorted((n for n in names if out[n] == "train"), key=lambda n: (sizes[n], position[n]))
            if len(train) > 1:
                out[train[0]] = split
                filled[split] = sizes[train[0]]
    return out


def subsample(rows: Sequence[T], keep: int, seed: int) -> list[T]:
    """``keep`` rows chosen with the seed, in their original order."""
    if keep >= len(rows):
        return list(rows)
    chosen = sorted(random.Random(seed).sample(range(len(rows)), keep))
    return [rows[i] for i in chosen]


def cap_splits(by_split: Mapping[str, Sequence[T]], max_rows: int | None, seed: int) -> dict[str, list[T]]:
    """Shrink every split by the same factor so the total is at most ``max_rows``."""
    total = sum(len(rows) for rows in by_split.values())
    if max_rows is None or total <= max_rows:
        return {split: list(rows) for split, rows in by_split.items()}
    scale = max_rows / total
    return {
        split: subsample(rows, max(1 if rows else 0, int(len(rows) * scale)), seed + i)
        for i, (split, rows) in enumerate(sorted(by_split.items()))
    }


@dataclass(frozen=True)
class ParallelPair:
    src: str  # source-language sentence (the msgstr of a catalogue: Spanish)
    tgt: str  # English (the msgid)
    domain: str
    group: str


def unique_sources(pairs: Iterable[ParallelPair], seen: set[str] | None = None) -> list[ParallelPair]:
    """``pairs`` without a source already in ``seen`` (or earlier in ``pairs``): the first wins."""
    seen = set() if seen is None else seen
    out: list[ParallelPair] = []
    for p in pairs:
        if p.src not in seen:
            seen.add(p.src)
            out.append(p)
    return out


def gettext_pairs(catalogues: Iterable[cat.Catalogue], report: InputReport) -> list[ParallelPair]:
    """Cleaned pairs, deduplicated on the source side (first catalogue in sorted order wins)."""
    return unique_sources(ParallelPair(translated, english, "gettext", catalogue.name)
                          for catalogue, english, translated in cat.iter_cleaned(catalogues, report))


def bible_pairs(verses: Iterable[VersePair]) -> list[ParallelPair]:
    return unique_sources(ParallelPair(v.es, v.en, "bible", v.book) for v in verses)


def split_domain(
    pairs: Sequence[ParallelPair], fractions: SplitFractions, seed: int, max_pairs: int | None
) -> tuple[dict[str, list[ParallelPair]], dict[str, str]]:
    """(split → pairs, group → split) for one domain."""
    sizes: dict[str, int] = {}
    for p in pairs:
        sizes[p.group] = sizes.get(p.group, 0) + 1
    where = assign_groups(sizes, fractions, seed)
    by_split: dict[str, list[ParallelPair]] = {s: [] for s in SPLITS}
    for p in pairs:
        by_split[where[p.group]].append(p)
    return cap_splits(by_split, max_pairs, seed), where


def write_parallel(
    out_dir: Path,
    root: Path,
    domains: Mapping[str, Sequence[ParallelPair]],
    *,
    fractions: SplitFractions,
    seed: int,
    max_pairs: int | None,
) -> dict[str, Any]:
    """Write ``train/valid/test.jsonl`` under ``out_dir``; return the manifest section.

    Sources are deduplicated across domains too, so a sentence cannot sit in two splits.
    """
    seen: set[str] = set()
    rows: dict[str, list[ParallelPair]] = {s: [] for s in SPLITS}
    counts: dict[str, dict[str, int]] = {}
    groups: dict[str, dict[str, list[str]]] = {}
    for index, (domain, pairs) in enumerate(sorted(domains.items())):
        by_split, where = split_domain(unique_sources(pairs, seen), fractions, seed + 1000 * index, max_pairs)
        counts[domain] = {s: len(by_split[s]) for s in SPLITS}
        groups[domain] = {s: sorted(g for g, w in where.items() if w == s) for s in SPLITS}
        for split in SPLITS:
            rows[split].extend(by_split[split])
    files: dict[str, FileRecord] = {
        split: write_jsonl(out_dir / f"{split}.jsonl", (asdict(p) for p in rows[split]), root=root)
        for split in SPLITS
    }
    return {
        "files": {s: r.as_dict() for s, r in files.items()},
        "counts": counts,
        "groups": groups,
    }

