"""What the ABNet encoder (cluster S) and decoder (cluster T) workers share.

The paper keeps the two halves of the data apart: S sees only the source
sentences, T only the targets (§3.2). Both sides read their own half of the
same tokenized split and agree on micro-batch ``i`` through a deterministic
schedule (seed, epoch permutation); the activation message carries the sample
ids so T can look up its targets. No text crosses the WAN.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from nebula_mq import config, topology
from nebula_mq.errors import DataError
from nebula_mq.settings import Settings

EVAL_KIND = "eval"  # meta "kind" of evaluation activations (no gradient comes back)


def eval_producer(encoder_id: str) -> str:
    """Producer id of an encoder's evaluation messages: a dedupe stream of their own."""
    return f"{encoder_id}-eval"


@dataclass(frozen=True)
class AbnetJob:
    """The ``[abnet]`` section of a job file."""

    preset: Literal["tiny", "small", "full"] = "tiny"
    # Layers kept from each pretrained stack (small preset); fewer = faster on CPU.
    encoder_layers: int = 6
    decoder_layers: int = 6
    # "synthetic": a seeded toy translation task (tests, tiny); "corpus": `data build` output.
    data: Literal["synthetic", "corpus"] = "synthetic"
    data_dir: str = "run/data"
    split: str = "train"
    batch_size: int = 16
    # "length": batches of similar source length (less padding); "random": plain shuffling;
    # "auto": length on the corpus, random on the synthetic task (its sentences are all short).
    batching: Literal["auto", "length", "random"] = "auto"
    # Synthetic task only: source length range and vocabulary come from the tiny preset.
    synthetic_len: int = 8
    # Micro-batches whose gradient is not back yet; bounds staleness and memory.
    in_flight: int = 4
    # Training samples used (0 = the whole split): a small set gives several epochs in a
    # short study, which is what delta compression feeds on.
    train_samples: int = 0
    # Domains of the training split to train on (empty = all), e.g. ["gettext"].
    domains: tuple[str, ...] = ()
    # Train only on sentences of at most this many source tokens (0 = all). Applied on S,
    # which picks the samples; T looks each one up by id.
    max_source_tokens: int = 0
    # "delta": activations travel as the compressed change from the same sample's last
    # reconstruction (AQ-SGD); "none": as themselves (nebula_mq.codecs.feedback).
    forward_feedback: Literal["none", "delta"] = "none"
    # "residual": the decoder adds each sample's gradient compression error to its next
    # gradient (error feedback); "none": plain compressed gradients.
    backward_feedback: Literal["none", "residual"] = "none"
    # Evaluation after training: N samples drawn from eval_split (0 = none) are encoded on
    # S, sent as kind=eval activations, beam-decoded on T and scored against T's references.
    eval_samples: int = 0
    eval_split: str = "test"
    # Domains the evaluation draws from (empty = every domain of eval_split).
    eval_domains: tuple[str, ...] = ()
    eval_beam: int = 4
    eval_max_len: int = 64
    lr: float = 1e-3
    # Linear warm-up of the learning rate over the first updates (0 = none). Without it,
    # Adam at 1e-3 can push the encoder adapters to a constant output in a few dozen steps
    # (every token the same vector: the decoder then ignores the source).
    warmup_steps: int = 0
    # After warm-up: "none" keeps lr; "cosine"/"linear" decay it to lr * min_lr_ratio at
    # the job's last step. A constant 1e-3 learnt and then diverged in the 60-minute run.
    lr_decay: Literal["none", "cosine", "linear"] = "none"
    min_lr_ratio: float = 0.1
    # Each side clips its adapters' gradients to this global norm before its step (0 = off).
    # Each side clips its own: the two halves have separate optimizers, as in the paper.
    grad_clip: float = 1.0
    # What the encoder does when every token gets the same vector (see docs/QUALITY.md):
    # "stop" fails the job before it overwrites good checkpoints; "warn" logs and goes on.
    on_collapse: Literal["stop", "warn"] = "stop"
    checkpoint_every: int = 10
    src_cluster: str = "s"
    tgt_cluster: str = "t"
    # Requester id of the (single) encoder worker; names its reply flow.
    encoder_id: str = "enc-0"

    def validate(self) -> None:
        if self.in_flight < 1:
            raise ValueError("in_flight >= 1")
        if self.batch_size < 1:
            raise ValueError("batch_size >= 1")
        if self.train_samples < 0 or self.eval_samples < 0:
            raise ValueError("train_samples >= 0 and eval_samples >= 0")
        if self.max_source_tokens < 0:
            raise ValueError("max_source_tokens >= 0")
        if self.warmup_steps < 0 or self.lr <= 0:
            raise ValueError("warmup_steps >= 0 and lr > 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0 or self.grad_clip < 0:
            raise ValueError("0 <= min_lr_ratio <= 1 and grad_clip >= 0")
        if self.eval_beam < 1 or self.eval_max_len < 1:
            raise ValueError("eval_beam >= 1 and eval_max_len >= 1")
        if self.src_cluster == self.tgt_cluster:
            raise ValueError("src_cluster != tgt_cluster")

    def flows(self) -> tuple[topology.Flow, topology.Flow]:
        act, reply = topology.abnet_flows(self.src_cluster, self.tgt_cluster, (self.encoder_id,))
        return act, reply


def learning_rate(job: AbnetJob, steps: int, step: int) -> float:
    """The learning rate of the update that makes ``step + 1`` of ``steps``: linear warm-up,
    then constant or decaying to ``lr * min_lr_ratio`` at the last step. A function of the
    step alone, so a resumed worker needs no scheduler state."""
    if step < job.warmup_steps:
        return job.lr * (step + 1) / job.warmup_steps
    if job.lr_decay == "none" or steps <= job.warmup_steps + 1:
        return job.lr
    progress = min(1.0, (step - job.warmup_steps) / (steps - job.warmup_steps - 1))
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if job.lr_decay == "cosine" else 1.0 - progress
    return job.lr * (job.min_lr_ratio + (1.0 - job.min_lr_ratio) * shape)


def adapter_optimizer(job: AbnetJob, parameters: list[Any]) -> Any:
    """One side's optimizer: AdamW without weight decay (adapters start near zero), its
    gradients clipped to ``grad_clip`` global norm."""
    import paddle  # here, not at the top: the launcher reads this module (plans) without paddle

    clip = paddle.nn.ClipGradByGlobalNorm(job.grad_clip) if job.grad_clip > 0 else None
    return paddle.optimizer.AdamW(learning_rate=job.lr, parameters=parameters, weight_decay=0.0, grad_clip=clip)


def load_job(settings: Settings) -> AbnetJob:
    return config.build(AbnetJob, dict(settings.abnet), settings.source or "<settings>", "abnet.")


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


SYNTHETIC_SAMPLES = 4096


def load_side(job: AbnetJob, seed: int, side: Literal["src", "tgt"], vocab: int,
              split: str | None = None) -> TranslationData:
    """Only this side's arrays are loaded (S never holds targets, T never sources).

    ``split`` defaults to the training split, which ``train_samples`` may shorten."""
    split = split or job.split
    limit = job.train_samples if split == job.split else 0
    if side == "tgt" and job.max_source_tokens:
        limit = 0  # S filters by length before it limits: T keeps every row S might send
    if job.data == "synthetic":
        arrays = synthetic_pairs(limit or SYNTHETIC_SAMPLES, vocab, job.synthetic_len, seed, side, split)
    else:
        path = Path(job.data_dir) / "tokenized" / f"{split}.npz"
        from nebula_mq.data.batches import load_arrays

        full = load_arrays(path)
        domains = job.domains if split == job.split else job.eval_domains if split == job.eval_split else ()
        if domains:
            full = _only_domains(full, domains, path)
        if split == job.split and job.max_source_tokens and side == "src":
            full = {k: v[full["src_mask"].sum(axis=1) <= job.max_source_tokens] for k, v in full.items()}
        arrays = {k: v[:limit] if limit else v for k, v in full.items()
                  if k in ("index", "domain") or k.startswith(f"{side}_")}
    by_length = job.batching == "length" or (job.batching == "auto" and job.data == "corpus")
    return TranslationData(arrays, job.batch_size, seed, by_length=by_length)


def _only_domains(arrays: dict[str, np.ndarray], domains: tuple[str, ...], path: Path) -> dict[str, np.ndarray]:
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


def model_config(job: AbnetJob, seed: int) -> Any:
    """The ABNet model config of this job (paddle-free; see nebula_mq.models.abnet_config)."""
    from nebula_mq.models import abnet_config

    if job.preset == "small":
        cfg = abnet_config.small(job.encoder_layers, job.decoder_layers)
    else:
        cfg = abnet_config.preset(job.preset)
    return dataclasses.replace(cfg, seed=seed)


def target_keep_ids(job: AbnetJob, train: TranslationData) -> np.ndarray | None:
    """MiniLM ids the training targets use: the decoder's output vocabulary (it cannot
    learn to produce a token it never saw). None for the synthetic task.

    The source side is not pruned: text a user brings later must reach the encoder
    as the pretrained tokenizer sees it, not as unknown tokens."""
    if job.data == "synthetic":
        return None
    return np.unique(train.arrays["tgt_ids"][train.arrays["tgt_mask"] > 0])
