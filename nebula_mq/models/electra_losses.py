"""ELECTRA step pieces (paper §3.1, eqs. 6-10): masking, sampling, the three losses.

Masking and sampling are numpy with an explicit ``np.random.Generator``, so the
generator side is reproducible bit for bit and its randomness can be derived
from ``(seed, step, micro-batch)`` instead of being checkpointed. The losses are
paddle, and each one is a *mean* over its positions (the paper writes sums;
ELECTRA's reference code and every implementation use means so that λ = 50
keeps the meaning it has there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn.functional as F

from nebula_mq.errors import ShapeMismatch


@dataclass(frozen=True)
class VocabSpec:
    """What masking needs to know about the token ids."""

    size: int
    pad_id: int
    mask_id: int
    # Ids never selected for masking and never drawn as replacements
    # (<s>, </s>, <pad>, <unk>, <mask>).
    special_ids: tuple[int, ...]


@dataclass(frozen=True)
class MaskedBatch:
    masked_ids: np.ndarray  # [B, T] int32: the generator's input (80% <mask>, 10% random, 10% kept)
    positions: np.ndarray  # [B, T] bool: the selected set M
    labels: np.ndarray  # [B, T] int32: the original ids (everywhere, not only in M)


def mask_batch(ids: np.ndarray, rng: np.random.Generator, vocab: VocabSpec, mask_prob: float = 0.15,
               attention_mask: np.ndarray | None = None) -> MaskedBatch:
    """BERT masking: choose round(mask_prob · n) maskable tokens per row (at least one), 80/10/10.

    Maskable = attended and not special. A row with no maskable token gets no
    position (the caller's batch should not contain such rows, but an empty row
    is not an error).
    """
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ShapeMismatch(f"ids must be [batch, seq], got shape {ids.shape}")
    if not 0.0 < mask_prob < 1.0:
        raise ValueError(f"mask_prob in (0, 1), got {mask_prob}")
    attn = (ids != vocab.pad_id) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    if attn.shape != ids.shape:
        raise ShapeMismatch(f"attention_mask shape {attn.shape} != ids shape {ids.shape}")
    maskable = attn & ~np.isin(ids, vocab.special_ids)
    n_maskable = maskable.sum(axis=1)
    k = np.where(n_maskable > 0, np.maximum(1, np.rint(mask_prob * n_maskable)), 0).astype(np.int64)
    # Uniform choice without replacement: the k smallest random keys among maskable tokens.
    keys = np.where(maskable, rng.random(ids.shape), np.inf)
    rank = np.argsort(np.argsort(keys, axis=1, kind="stable"), axis=1, kind="stable")
    positions = rank < k[:, None]
    action = rng.random(ids.shape)
    random_tokens = draw_ordinary_tokens(rng, ids.shape, vocab)
    masked = np.where(positions & (action < 0.8), vocab.mask_id, ids)
    masked = np.where(positions & (action >= 0.8) & (action < 0.9), random_tokens, masked)
    return MaskedBatch(masked.astype(np.int32), positions, ids.astype(np.int32))


def draw_ordinary_tokens(rng: np.random.Generator, shape: tuple[int, ...], vocab: VocabSpec) -> np.ndarray:
    """Uniform ids over the vocabulary without the special ids."""
    ordinary = np.setdiff1d(np.arange(vocab.size), np.asarray(vocab.special_ids))
    return ordinary[rng.integers(0, len(ordinary), size=shape)]


def sample_from_logits(logits: np.ndarray, rng: np.random.Generator, forbidden: tuple[int, ...]) -> np.ndarray:
    """One draw per row of softmax(logits) [N, V] by inverse CDF in float64; ``forbidden`` ids get p = 0."""
    z = np.asarray(logits, dtype=np.float64).copy()
    z[:, list(forbidden)] = -np.inf
    z -= z.max(axis=1, keepdims=True)
    cdf = np.cumsum(np.exp(z), axis=1)  # [N, V]
    u = rng.random(len(z)) * cdf[:, -1]
    picked = (cdf < u[:, None]).sum(axis=1)
    return np.minimum(picked, z.shape[1] - 1).astype(np.int32)


def corrupt(batch: MaskedBatch, sampled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 7: x_corrupt = sample at M, original elsewhere; replaced = (x_corrupt != x).

    A sample equal to the original token is *not* replaced (ELECTRA's label rule).
    """
    corrupted = batch.labels.copy()
    corrupted[batch.positions] = sampled
    replaced = (corrupted != batch.labels).astype(np.uint8)
    return corrupted.astype(np.int32), replaced


# --------------------------------------------------------------------------- paddle losses


def gather_positions(states: paddle.Tensor, positions: np.ndarray) -> paddle.Tensor:
    """[B, T, H] states at the True cells of ``positions`` [B, T] -> [N, H] (row-major order)."""
    b, t, h = states.shape
    flat = np.flatnonzero(positions.reshape(-1)).astype(np.int64)
    return paddle.gather(states.reshape([b * t, h]), paddle.to_tensor(flat))


def token_cross_entropy(logits: paddle.Tensor, targets: np.ndarray) -> paddle.Tensor:
    """Mean −log p(target) over rows of logits [N, V] (eq. 6 for G, eq. 10 for the CLM head)."""
    return F.cross_entropy(logits, paddle.to_tensor(targets.astype(np.int64)).unsqueeze(-1), reduction="mean")


def replaced_token_loss(logits: paddle.Tensor, replaced: np.ndarray, attention: np.ndarray) -> paddle.Tensor:
    """Eq. 8 as a mean over attended tokens.

    ``logits`` [B, T] score "replaced"; the paper's D(x, i) = P(original) is
    1 − sigmoid(logit), so this binary cross-entropy is exactly eq. 8.
    """
    target = paddle.to_tensor(replaced.astype(np.float32))
    weight = paddle.to_tensor(attention.astype(np.float32))
    per_token = F.binary_cross_entropy_with_logits(logits, target, reduction="none")  # [B, T]
    return (per_token * weight).sum() / paddle.clip(weight.sum(), min=1.0)


def rtd_accuracy(logits: np.ndarray, replaced: np.ndarray, attention: np.ndarray) -> dict[str, float]:
    """Accuracy over attended tokens, and recall on the replaced ones (the hard class)."""
    att = attention.astype(bool)
    pred = logits > 0
    truth = replaced.astype(bool)
    acc = float((pred == truth)[att].mean()) if att.any() else 0.0
    rep = truth & att
    recall = float(pred[rep].mean()) if rep.any() else 0.0
    return {"rtd_acc": acc, "rtd_replaced_recall": recall}
