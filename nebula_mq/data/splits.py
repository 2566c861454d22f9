"""Train/valid/test splits by source, so no test sentence has a sibling in training.

A *group* is the unit that is never divided: a gettext catalogue, a Bible book.
Groups are shuffled with the seed and dealt to the held-out splits until each
holds about its fraction of the rows; everything else trains.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

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
