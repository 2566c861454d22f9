"""The es→en parallel corpus: gettext catalogues and the Bible, split by source.

Rows are ``{"src", "tgt", "domain", "group"}``: ``domain`` is what BLEU is
reported by (``gettext``, ``bible``), ``group`` the unit of the split (a
catalogue such as ``git`` or ``libreoffice/svx``, a book such as ``Gen``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nebula_mq.data import catalogues as cat
from nebula_mq.data.bible import VersePair
from nebula_mq.data.corpus_io import FileRecord, InputReport, write_jsonl
from nebula_mq.data.splits import SPLITS, SplitFractions, assign_groups, cap_splits


@dataclass(frozen=True)
class ParallelPair:
    src: str  # source-language sentence (the msgstr of a catalogue: Spanish)
    tgt: str  # English (the msgid)
    domain: str
    group: str

    def as_row(self) -> dict[str, str]:
        return {"src": self.src, "tgt": self.tgt, "domain": self.domain, "group": self.group}


def gettext_pairs(catalogues: Iterable[cat.Catalogue], report: InputReport) -> list[ParallelPair]:
    """Cleaned pairs, deduplicated on the source side (first catalogue in sorted order wins)."""
    seen: set[str] = set()
    out: list[ParallelPair] = []
    for catalogue, english, translated in cat.iter_cleaned(catalogues, report):
        if translated in seen:
            continue
        seen.add(translated)
        out.append(ParallelPair(translated, english, "gettext", catalogue.name))
    return out


def bible_pairs(verses: Iterable[VersePair]) -> list[ParallelPair]:
    seen: set[str] = set()
    out: list[ParallelPair] = []
    for v in verses:
        if v.es in seen:
            continue
        seen.add(v.es)
        out.append(ParallelPair(v.es, v.en, "bible", v.book))
    return out


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
        unique = []
        for p in pairs:
            if p.src not in seen:
                seen.add(p.src)
                unique.append(p)
        by_split, where = split_domain(unique, fractions, seed + 1000 * index, max_pairs)
        counts[domain] = {s: len(by_split[s]) for s in SPLITS}
        groups[domain] = {s: sorted(g for g, w in where.items() if w == s) for s in SPLITS}
        for split in SPLITS:
            rows[split].extend(by_split[split])
    files: dict[str, FileRecord] = {
        split: write_jsonl(out_dir / f"{split}.jsonl", (p.as_row() for p in rows[split]), root=root)
        for split in SPLITS
    }
    return {
        "files": {s: r.as_dict() for s, r in files.items()},
        "counts": counts,
        "groups": groups,
    }

