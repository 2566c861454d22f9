"""The language-identification example's data: real gettext strings of the machine's
installed ``.mo`` catalogues, as UTF-8 bytes, labelled with their language.

Cluster S holds the byte arrays, cluster T the labels. Both read the same catalogues and
split them with the same fixed seed, so sample id *i* names the same string on both sides;
the activation carries the sample ids and T looks its labels up. Nothing is cached on disk:
each process reads the catalogues once (about 5 s for the eight languages).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from nebula_mq.data.batches import pad_and_truncate
from nebula_mq.data.catalogues import discover
from nebula_mq.data.corpus_io import InputReport
from nebula_mq.data.multilingual import collect_texts
from nebula_mq.errors import DataError

# Languages with 25-40k distinct strings on a Debian/Ubuntu host; the ones found are used.
LANGUAGES = ("de", "es", "fr", "it", "pl", "pt", "ru", "sv")
MAX_BYTES = 48  # sequence length L: a string's first 47 bytes and its last one
PER_LANGUAGE = 4000  # training strings per language, at most
HELD_OUT = 500  # test strings per language, at most (a fifth of a smaller language)
BATCH = 32
SEED = 0  # the split and the batch order: fixed, so every side and evaluate.py agree
PAD = 0  # byte b is token b + 1


@dataclass(frozen=True)
class LangData:
    """Byte arrays (int64 [N, MAX_BYTES], 0 = padding) and labels (int64 [N], an index into
    ``languages``) of the training and the held-out split."""

    languages: tuple[str, ...]
    train_bytes: np.ndarray
    train_labels: np.ndarray
    test_bytes: np.ndarray
    test_labels: np.ndarray

    def baseline(self) -> tuple[float, float]:
        """(loss of the uniform guess ln K, held-out accuracy of always naming the largest class)."""
        counts = np.bincount(self.test_labels, minlength=len(self.languages))
        return float(np.log(len(self.languages))), float(counts.max() / counts.sum())


def encode(texts: Sequence[str], max_bytes: int = MAX_BYTES) -> np.ndarray:
    """UTF-8 bytes of each text, shifted by one (0 is padding), cut and right-padded to ``max_bytes``."""
    rows = [[b + 1 for b in text.encode("utf-8")] for text in texts]
    ids, _mask = pad_and_truncate(rows, max_bytes, PAD)
    out = np.full((len(rows), max_bytes), PAD, dtype=np.int64)
    out[:, : ids.shape[1]] = ids
    return out


def split(texts: Mapping[str, Sequence[str]], per_language: int = PER_LANGUAGE, held_out: int = HELD_OUT,
          seed: int = SEED) -> LangData:
    """Label, shuffle and split ``{language: strings}``. A string found in several languages
    (an untranslated name, a number) says nothing about its language and is dropped."""
    seen = Counter(t for rows in texts.values() for t in set(rows))
    languages = tuple(sorted(lang for lang, rows in texts.items() if any(seen[t] == 1 for t in rows)))
    if len(languages) < 2:
        raise DataError(f"language identification needs at least 2 languages, found {list(languages) or 'none'}")
    train: list[tuple[str, int]] = []
    test: list[tuple[str, int]] = []
    for label, lang in enumerate(languages):
        rows = sorted(t for t in set(texts[lang]) if seen[t] == 1)
        order = np.random.default_rng([seed, label]).permutation(len(rows))
        n_test = min(held_out, len(rows) // 5)
        test += [(rows[i], label) for i in order[:n_test]]
        train += [(rows[i], label) for i in order[n_test:n_test + per_language]]
    return LangData(languages, encode([t for t, _ in train]), np.array([y for _, y in train], dtype=np.int64),
                    encode([t for t, _ in test]), np.array([y for _, y in test], dtype=np.int64))


def read_texts(languages: Iterable[str] = LANGUAGES) -> dict[str, list[str]]:
    """``{language: distinct translated strings}`` of the installed catalogues."""
    return collect_texts(discover(), InputReport(), languages=list(languages))


@lru_cache(maxsize=1)
def dataset(languages: tuple[str, ...] = LANGUAGES) -> LangData:
    """The example's splits, read from this machine's catalogues (once per process)."""
    return split(read_texts(languages))


def batch_ids(mb: int, samples: int, batch: int = BATCH, seed: int = SEED) -> np.ndarray:
    """Sample ids of micro-batch ``mb``: a fresh permutation of ``samples`` ids per epoch,
    the same on both sides and after a resume."""
    epoch, k = divmod(mb, samples // batch)
    return np.random.default_rng([seed, epoch]).permutation(samples)[k * batch:(k + 1) * batch].astype(np.int64)
