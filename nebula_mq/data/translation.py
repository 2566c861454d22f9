"""One side's view of a parallel corpus, addressed by micro-batch (pure numpy).

ABNet keeps the two halves of the data apart: S holds only the sources, T only the
targets (paper §3.2). Both sides cut the same split into the same micro-batches from
a seeded schedule, and T finds its targets by the sample ids each activation carries.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from nebula_mq.errors import DataError


class TranslationData:
    """One side's view of the training pairs, addressed by micro-batch index.

    Batches of an epoch: a seeded permutation of the samples; with ``by_length``
    (on S, which holds the source lengths), each run of ``BUCKET_BATCHES`` batches
    is sorted by source length before it is cut, and the batches are then
    shuffled, so a batch holds sentences of similar length and pads little
    (gettext strings are ~13 tokens, Bible verses ~36). T never needs the
    order: each activation names its samples."""

    BUCKET_BATCHES = 50

    def __init__(self, arrays: dict[str, np.ndarray], batch_size: int, seed: int, by_length: bool = False) -> None:
        self.arrays = arrays
        self.n = len(arrays["index"])
        if self.n < batch_size:
            raise DataError(f"{self.n} samples are fewer than one batch of {batch_size}")
        self.batch_size = batch_size
        self.seed = seed
        self.batches_per_epoch = self.n // batch_size  # drop_last: equal shapes per epoch
        self._row_of = {int(s): r for r, s in enumerate(arrays["index"])}
        self._lengths = arrays["src_mask"].sum(axis=1) if by_length and "src_mask" in arrays else None
        self._epoch: tuple[int, np.ndarray] | None = None  # (epoch, its batches [K, B])

    def epoch_batches(self, epoch: int) -> np.ndarray:
        """Rows of every batch of ``epoch``, [batches_per_epoch, batch_size]; deterministic."""
        if self._epoch is not None and self._epoch[0] == epoch:
            return self._epoch[1]
        b = self.batch_size
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n)[: self.batches_per_epoch * b]
        if self._lengths is None:
            batches = order.reshape(-1, b)
        else:
            run = b * self.BUCKET_BATCHES
            runs = [order[i:i + run] for i in range(0, len(order), run)]
            order = np.concatenate([r[np.argsort(self._lengths[r], kind="stable")] for r in runs])
            batches = order.reshape(-1, b)
            batches = batches[np.random.default_rng([self.seed, epoch, 1]).permutation(len(batches))]
        self._epoch = (epoch, batches)
        return batches

    def evaluation_rows(self, n: int) -> np.ndarray:
        """``n`` rows drawn (seeded) from the whole split, so every domain is scored, not the
        first rows (the test split lists one domain after the other); ordered by source
        length when the lengths are known, so each evaluation batch pads little."""
        rows = np.sort(np.random.default_rng([self.seed, 99]).choice(self.n, min(n, self.n), replace=False))
        if "src_mask" in self.arrays:
            rows = rows[np.argsort(self.arrays["src_mask"][rows].sum(axis=1), kind="stable")]
        return rows

    def rows(self, mb: int) -> np.ndarray:
        epoch, k = divmod(mb, self.batches_per_epoch)
        return self.epoch_batches(epoch)[k]

    def source(self, mb: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sample ids int64 [B], src ids int32 [B, S], src mask int8 [B, S]), trimmed."""
        return self.source_rows(self.rows(mb))

    def source_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`source`, for explicit rows (evaluation walks the split in order)."""
        mask = self.arrays["src_mask"][rows]
        width = max(int(mask.sum(axis=1).max()), 1)
        ids = self.arrays["src_ids"][rows][:, :width].astype(np.int32)
        return self.arrays["index"][rows].astype(np.int64), ids, mask[:, :width].astype(np.int8)

    def targets(self, sample_ids: np.ndarray) -> np.ndarray:
        """Target ids int64 [B, T] of the given samples, trimmed to the longest."""
        try:
            rows = np.array([self._row_of[int(s)] for s in sample_ids], dtype=np.int64)
        except KeyError as exc:
            raise DataError(f"unknown sample id {exc}") from None
        mask = self.arrays["tgt_mask"][rows]
        width = max(int(mask.sum(axis=1).max()), 2)
        return self.arrays["tgt_ids"][rows][:, :width].astype(np.int64)


def synthetic_pairs(n: int, vocab: int, max_len: int, seed: int, side: str,
                    split: str = "train") -> dict[str, np.ndarray]:
    """A toy translation task for the tiny preset: the target is a fixed token
    permutation of the source, framed by BOS=1 and EOS=2 (pad 0).
    ``side`` selects which half is materialised, as each cluster sees one half;
    every split shares the permutation (the "language"), other splits draw other sentences."""
    rng = np.random.default_rng([seed, 7])
    perm = rng.permutation(np.arange(3, vocab))
    if split != "train":
        rng = np.random.default_rng([seed, 7, int.from_bytes(hashlib.sha256(split.encode()).digest()[:4], "little")])
    lengths = rng.integers(2, max_len + 1, size=n)
    src = np.zeros((n, max_len), np.int32)
    tgt = np.zeros((n, max_len + 2), np.int32)
    for i, length in enumerate(lengths):
        tokens = rng.integers(3, vocab, size=length)
        src[i, :length] = tokens
        tgt[i, : length + 2] = [1, *perm[tokens - 3], 2]
    out: dict[str, np.ndarray] = {"index": np.arange(n, dtype=np.int64)}
    if side == "src":
        out.update(src_ids=src, src_mask=(src != 0).astype(np.int8))
    else:
        out.update(tgt_ids=tgt, tgt_mask=(tgt != 0).astype(np.int8))
    return out


def only_domains(arrays: dict[str, np.ndarray], domains: tuple[str, ...], path: Path) -> dict[str, np.ndarray]:
    """The rows of the given domains (``[abnet] domains``); both sides select the same rows."""
    if "domain" not in arrays:
        raise DataError(f"{path} has no domain column: rebuild it with `nebula-mq data build`")
    keep = np.isin(arrays["domain"], list(domains))
    if not keep.any():
        raise DataError(f"{path} has no rows of domains {list(domains)}; it has {sorted(set(arrays['domain']))}")
    return {k: v[keep] for k, v in arrays.items()}


def sample_lengths(mask: np.ndarray) -> np.ndarray:
    """Real tokens per sample of a [B, S] 1/0 mask (keys the per-sample caches' blocks)."""
    return np.asarray(mask, dtype=np.int64).sum(axis=1)
