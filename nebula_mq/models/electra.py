"""ERNIE-M Extra-Cloud at small scale (paper §3.1, Figure 4): configuration, tasks, models.

* The **generator** (cluster A) is a BERT-style masked LM with its *own*
  embeddings. Nothing is shared with the discriminator, so all that crosses
  the WAN is token ids and 0/1 masks (the paper's reason for not sharing).
* The **discriminator** (cluster B) is a Transformer encoder with a
  replaced-token-detection head (one logit per token) and a corrective-LM head
  (re-predicts the original token at the masked positions M, eq. 10).
* **M3**: K generators, one per language group, each with its own
  :class:`GeneratorTask` (multilingual MLM, or translation pairs for TRTD), all
  feeding one discriminator.

The step logic lives in :mod:`.electra_trainers`. Masking and sampling (below) are numpy
with an explicit ``np.random.Generator``, so the generator side is reproducible bit for bit
and its randomness can be derived from ``(seed, step, micro-batch)`` instead of being
checkpointed. The losses (eqs. 6-10) are paddle, and each one is a *mean* over its positions
(the paper writes sums; ELECTRA's reference code and every implementation use means so that
λ = 50 keeps the meaning it has there).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from nebula_mq import config
from nebula_mq.errors import ConfigError, DataError, ShapeMismatch
from nebula_mq.models.bert import BertConfig, BertEncoder

# XLM-R / e5 special ids in the *original* 250,002-piece vocabulary.
XLMR_SPECIALS = {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": 250001}
E5_SMALL = {"hidden": 384, "layers": 12, "heads": 12, "ffn": 1536}


@dataclass(frozen=True)
class EncoderSize:
    hidden: int
    layers: int
    heads: int
    ffn: int

    def validate(self) -> None:
        if min(self.hidden, self.layers, self.heads, self.ffn) < 1 or self.hidden % self.heads:
            raise ValueError("positive sizes with hidden divisible by heads")


@dataclass(frozen=True)
class GeneratorConfig:
    size: EncoderSize
    # Registry id of the generator's task (see TASKS): "mlm" or "trtd".
    task: Literal["mlm", "trtd"] = "mlm"
    # Language group this generator serves (M3: one generator per family).
    group: str = "all"
    lr: float = 5e-4
    # Forward passes per optimiser step: the paper's G computes n results per
    # run, one per sub-discriminator, and updates once (gradients accumulated).
    micro_batches: int = 1
    # Mixed into every masking / sampling RNG of this generator.
    seed: int = 1


@dataclass(frozen=True)
class ElectraConfig:
    preset: str
    # Rows of both embeddings; 0 in the "pretrained" preset until the corpus
    # vocabulary is known (see :meth:`with_pruned_vocab`).
    vocab_size: int
    max_len: int
    discriminator: EncoderSize
    generators: tuple[GeneratorConfig, ...]
    pad_id: int = 1
    bos_id: int = 0
    eos_id: int = 2
    unk_id: int = 3
    mask_id: int = 4
    mask_prob: float = 0.15
    rtd_weight: float = 50.0  # λ in eq. 11
    clm_weight: float = 1.0  # γ in eq. 11
    disc_lr: float = 2e-4
    weight_decay: float = 0.01
    # Linear warm-up then linear decay to 0 at total_steps (paper §4.1).
    warmup_steps: int = 10
    total_steps: int = 1000
    batch_size: int = 8
    # "e5-small": the discriminator starts from multilingual-e5-small (as
    # ERNIE-M Extra starts from ERNIE-M); "random": from scratch.
    init: Literal["random", "e5-small"] = "random"
    seed: int = 0

    def validate(self) -> None:
        if self.vocab_size and not 0 <= max(self.special_ids) < self.vocab_size:
            raise ValueError("special ids inside the vocabulary")
        if not self.generators:
            raise ValueError("at least one generator")
        if not 0.0 < self.mask_prob < 1.0 or self.max_len < 4 or self.total_steps < 1:
            raise ValueError("0 < mask_prob < 1, max_len >= 4, total_steps >= 1")

    @property
    def special_ids(self) -> tuple[int, ...]:
        return (self.bos_id, self.pad_id, self.eos_id, self.unk_id, self.mask_id)

    @property
    def vocab(self) -> VocabSpec:
        return VocabSpec(self.vocab_size, self.pad_id, self.mask_id, self.special_ids)

    def bert_config(self, size: EncoderSize) -> BertConfig:
        # positions / type_vocab / eps as e5-small, so pretrained tensors load 1:1.
        return BertConfig(self.vocab_size, size.hidden, size.layers, size.heads, size.ffn,
                          positions=512, type_vocab=2, layer_norm_eps=1e-12)

    def with_pruned_vocab(self, kept_ids: np.ndarray) -> ElectraConfig:
        """The config for a vocabulary pruned to ``kept_ids`` (original XLM-R ids, new id = index)."""
        kept = np.asarray(kept_ids, dtype=np.int64)
        new_of = {int(old): new for new, old in enumerate(kept)}
        missing = [name for name, old in XLMR_SPECIALS.items() if old not in new_of]
        if missing:
            raise DataError(f"pruned vocabulary lacks special tokens {missing}; keep XLMR_SPECIALS ids")
        ids: dict[str, Any] = {f"{name}_id": new_of[old] for name, old in XLMR_SPECIALS.items()}
        return dataclasses.replace(self, vocab_size=len(kept), **ids)


PRESETS: dict[str, dict[str, Any]] = {
    # Unit tests: seconds on one core.
    "tiny": {"vocab_size": 512, "max_len": 32, "batch_size": 8, "warmup_steps": 3, "total_steps": 200,
             "disc_lr": 1e-3, "discriminator": {"hidden": 64, "layers": 2, "heads": 2, "ffn": 128},
             "generators": [{"size": {"hidden": 32, "layers": 1, "heads": 2, "ffn": 64}, "lr": 2e-3}]},
    # The CPU demo: a few minutes for a few hundred steps.
    "small": {"vocab_size": 8000, "max_len": 64, "batch_size": 16, "warmup_steps": 20, "total_steps": 400,
              "disc_lr": 5e-4, "discriminator": {"hidden": 128, "layers": 4, "heads": 4, "ffn": 512},
              "generators": [{"size": {"hidden": 64, "layers": 2, "heads": 2, "ffn": 256}}]},
    # Discriminator = multilingual-e5-small (vocab pruned to the corpus), smaller random generator.
    "pretrained": {"vocab_size": 0, "max_len": 64, "batch_size": 16, "warmup_steps": 50, "total_steps": 1000,
                   "disc_lr": 1e-4, "init": "e5-small", "discriminator": dict(E5_SMALL),
                   "generators": [{"size": {"hidden": 128, "layers": 2, "heads": 2, "ffn": 512}}],
                   **{f"{k}_id": v for k, v in XLMR_SPECIALS.items()}},
}


def electra_config(section: Mapping[str, Any] | None = None, source: str = "<electra>") -> ElectraConfig:
    """Build from a ``[electra]`` table: ``preset = "tiny"`` plus any field overrides.

    Override tables merge into the preset's (``[electra.discriminator] layers = 4``);
    ``generators`` replaces the preset's list when given.
    """
    data = dict(section or {})
    name = data.pop("preset", "tiny")
    if name not in PRESETS:
        raise ConfigError(source, "preset", f"one of {sorted(PRESETS)}", name)
    merged = _merge(PRESETS[name], data)
    merged["preset"] = name
    return config.build(ElectraConfig, merged, source)


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
    return out


# --------------------------------------------------------------------------- tasks (M3)


class GeneratorTask(abc.ABC):
    """Extension point: how one generator turns its raw examples into model input ids."""

    task_id: str  # travels with the micro-batch so the discriminator can log per task

    @abc.abstractmethod
    def build_inputs(self, examples: Sequence[Any], cfg: ElectraConfig) -> np.ndarray:
        """Examples -> [B, max_len] int32 ids, padded with pad_id."""


def _pad_rows(rows: list[list[int]], cfg: ElectraConfig) -> np.ndarray:
    out = np.full((len(rows), cfg.max_len), cfg.pad_id, dtype=np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row[: cfg.max_len]
    return out


class MultilingualMLM(GeneratorTask):
    """MRTD: each example is one sentence's ids (any language), ``<s> … </s>``."""

    task_id = "mlm"

    def build_inputs(self, examples: Sequence[Sequence[int]], cfg: ElectraConfig) -> np.ndarray:
        rows = []
        for ex in examples:
            body = [int(t) for t in ex if t not in (cfg.bos_id, cfg.eos_id)][: cfg.max_len - 2]
            rows.append([cfg.bos_id, *body, cfg.eos_id])
        return _pad_rows(rows, cfg)


class TranslationPairMLM(GeneratorTask):
    """TRTD: each example is a (source ids, target ids) pair, packed ``<s> src </s></s> tgt </s>``.

    Both halves are truncated to share max_len, so masking (uniform over the
    packed row) falls on both languages, as XLM-E's TRTD prescribes.
    """

    task_id = "trtd"

    def build_inputs(self, examples: Sequence[tuple[Sequence[int], Sequence[int]]], cfg: ElectraConfig) -> np.ndarray:
        budget = cfg.max_len - 4
        rows = []
        for src, tgt in examples:
            a = [int(t) for t in src if t not in (cfg.bos_id, cfg.eos_id)]
            b = [int(t) for t in tgt if t not in (cfg.bos_id, cfg.eos_id)]
            while len(a) + len(b) > budget:  # trim the longer side first
                (a if len(a) >= len(b) else b).pop()
            rows.append([cfg.bos_id, *a, cfg.eos_id, cfg.eos_id, *b, cfg.eos_id])
        return _pad_rows(rows, cfg)


TASKS: dict[str, GeneratorTask] = {t.task_id: t for t in (MultilingualMLM(), TranslationPairMLM())}


# --------------------------------------------------------------------------- models


class TokenPredictionHead(nn.Layer):
    """BERT's LM head: dense → gelu → LayerNorm → vocabulary logits."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.ln = nn.LayerNorm(hidden, epsilon=1e-12)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, h: paddle.Tensor) -> paddle.Tensor:
        return self.decoder(self.ln(F.gelu(self.dense(h))))  # [..., V]


class Generator(nn.Layer):
    """BERT-style masked LM with its own embeddings (never shared with D)."""

    def __init__(self, cfg: ElectraConfig, gen: GeneratorConfig) -> None:
        super().__init__()
        self.encoder = BertEncoder(cfg.bert_config(gen.size))
        self.mlm = TokenPredictionHead(gen.size.hidden, cfg.vocab_size)


class Discriminator(nn.Layer):
    """Encoder + RTD head (one "replaced" logit per token) + corrective-LM head."""

    def __init__(self, cfg: ElectraConfig) -> None:
        super().__init__()
        h = cfg.discriminator.hidden
        self.encoder = BertEncoder(cfg.bert_config(cfg.discriminator))
        self.rtd = nn.Sequential(nn.Linear(h, h), nn.GELU(), nn.Linear(h, 1))
        self.clm = TokenPredictionHead(h, cfg.vocab_size)


# --------------------------------------------------------------------------- masking and losses


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
