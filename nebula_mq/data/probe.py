"""Cross-lingual transfer probe data: which software catalogue does a UI string come from?

The task is built from the installed gettext catalogues: each class is one
catalogue (postgres, git, gnupg...), an example is one message. A classifier is
trained on the English msgids of the training messages and evaluated on the
held-out messages in English *and* in their translations (the msgstr of the
same msgid in the es/de/fr/ru/zh_CN catalogue). Only msgids translated in
every probed language are used, so every language is scored on the same
held-out messages: differences between languages are transfer, not sampling.

The split is by message (seeded), never by language: a held-out English
message and its translations are all unseen in training.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from nebula_mq.data.catalogues import DEFAULT_ROOTS, discover, message_pairs, read_catalogue
from nebula_mq.errors import DataError

# Distinct software domains, each translated into all DEFAULT_LOCALES on Debian.
DEFAULT_DOMAINS: tuple[str, ...] = ("postgres-15", "git", "gnupg2", "xkeyboard-config", "shared-mime-info",
                                    "iso_639")
DEFAULT_LOCALES: tuple[str, ...] = ("es", "de", "fr", "ru", "zh_CN")
SOURCE_LANGUAGE = "en"


@dataclass(frozen=True)
class ProbeSet:
    """English training strings and held-out strings in every language, labelled by class index."""

    classes: tuple[str, ...]  # catalogue name of each class index
    train_texts: tuple[str, ...]  # English msgids
    train_labels: np.ndarray  # int64 [n_train]
    # Language ("en", then each locale) -> held-out texts, in the same message order for all.
    test_texts: dict[str, tuple[str, ...]]
    test_labels: np.ndarray  # int64 [n_test], shared by every language

    @property
    def languages(self) -> tuple[str, ...]:
        return tuple(self.test_texts)

    def all_texts(self) -> list[str]:
        return [*self.train_texts, *(t for texts in self.test_texts.values() for t in texts)]


def _aligned_messages(domain: str, locales: Sequence[str], roots: Iterable[str]) -> list[tuple[str, ...]]:
    """(msgid, msgstr per locale) of every message of ``domain`` translated in all ``locales``."""
    found = {c.locale: c for c in discover(roots, locales=locales) if c.name == domain}
    missing = [loc for loc in locales if loc not in found]
    if missing:
        raise DataError(f"probe domain {domain!r}: no catalogue for {missing} under {list(roots)}")
    tables = [dict(message_pairs(read_catalogue(found[loc].path))) for loc in locales]
    shared = set(tables[0]).intersection(*tables[1:])
    return [(msgid, *(t[msgid] for t in tables)) for msgid in sorted(shared)]


def build_probe_set(domains: Sequence[str] = DEFAULT_DOMAINS, locales: Sequence[str] = DEFAULT_LOCALES, *,
                    per_class: int = 300, heldout_fraction: float = 0.3, seed: int = 0,
                    roots: Iterable[str] = DEFAULT_ROOTS) -> ProbeSet:
    """Balanced probe set: ``per_class`` messages per domain (fewer if a domain lacks them
    would unbalance it, so the smallest domain caps every class), split by message.

    A msgid found in two domains is dropped from both (its label would be ambiguous).
    """
    if len(set(domains)) < 2:
        raise DataError(f"the probe needs at least 2 distinct domains, got {list(domains)}")
    if per_class < 2 or not 0.0 < heldout_fraction < 1.0:
        raise DataError("per_class >= 2 and 0 < heldout_fraction < 1")
    roots = tuple(roots)
    rows = {d: _aligned_messages(d, locales, roots) for d in domains}
    seen: dict[str, int] = {}
    for d in domains:
        for r in rows[d]:
            seen[r[0]] = seen.get(r[0], 0) + 1
    rows = {d: [r for r in rows[d] if seen[r[0]] == 1] for d in domains}
    n = min(per_class, *(len(r) for r in rows.values()))
    n_test = max(1, int(round(n * heldout_fraction)))
    if n - n_test < 1:
        raise DataError(f"probe domains have only {n} usable messages each: too few to split")
    rng = np.random.default_rng(seed)
    train: list[tuple[str, int]] = []
    test: list[tuple[tuple[str, ...], int]] = []
    for label, d in enumerate(domains):
        picked = [rows[d][i] for i in rng.permutation(len(rows[d]))[:n]]
        test += [(r, label) for r in picked[:n_test]]
        train += [(r[0], label) for r in picked[n_test:]]
    languages = (SOURCE_LANGUAGE, *locales)
    return ProbeSet(
        classes=tuple(domains),
        train_texts=tuple(t for t, _ in train),
        train_labels=np.array([y for _, y in train], dtype=np.int64),
        test_texts={lang: tuple(r[i] for r, _ in test) for i, lang in enumerate(languages)},
        test_labels=np.array([y for _, y in test], dtype=np.int64),
    )
