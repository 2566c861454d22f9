"""What the ABNet encoder (cluster S) and decoder (cluster T) workers share.

The paper keeps the two halves of the data apart: S sees only the source
sentences, T only the targets (§3.2). Both sides read their own half of the
same tokenized split and agree on micro-batch ``i`` through a deterministic
schedule (seed, epoch permutation); the activation message carries the sample
ids so T can look up its targets. No text crosses the WAN.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from nebula_mq import config
from nebula_mq.data.translation import TranslationData, only_domains, synthetic_pairs
from nebula_mq.config import PATH
from nebula_mq.errors import ConfigError
from nebula_mq.settings import Settings
from workers.split.job import Placement

EVAL_KIND = "eval"  # meta "kind" of evaluation activations (no gradient comes back)

if TYPE_CHECKING:  # paddle is imported by the workers only; the launcher reads this module
    import paddle

    from nebula_mq.models.abnet_config import ABNetConfig

# The roles' registered names: what plans launch and `worker --role` takes.
ENCODER_ROLE = "abnet-encoder"
DECODER_ROLE = "abnet-decoder"


def eval_producer(head_id: str) -> str:
    """Producer id of an encoder's evaluation messages: a dedupe stream of their own."""
    return f"{head_id}-eval"


# ABNet's names for the placement keys in ``[abnet]``, also read: the encoder is the head.
PLACEMENT_ALIASES = {"src_cluster": "head_cluster", "tgt_cluster": "tail_cluster", "encoder_id": "head_id",
                     "encoder_ranks": "head_ranks", "decoder_ranks": "tail_ranks"}


@dataclass(frozen=True)
class AbnetJob(Placement):
    """The ``[abnet]`` section of a job file: the split placement (``head_*`` is the encoder on
    the source side, ``tail_*`` the decoder on the target side) and the translation model."""

    head_id: str = "enc-0"
    tail_id: str = "dec-0"
    # Micro-batches whose gradient is not back yet; bounds staleness and memory.
    in_flight: int = 4

    # "tiny": a small random model (tests); "small": pretrained e5-small encoder and MiniLM
    # decoder cut to encoder_layers / decoder_layers; "full": every pretrained layer.
    preset: Literal["tiny", "small", "full"] = "tiny"
    # Layers kept from the pretrained encoder stack (small preset); fewer = faster on CPU.
    encoder_layers: int = 6
    # Layers kept from the pretrained decoder stack (small preset).
    decoder_layers: int = 6
    # A Scenario I job file (or a disc-root checkpoint folder) whose trained discriminator
    # encoder replaces the encoder's frozen stack, as the paper fine-tunes ABNet from the
    # ERNIE-M Extra encoder ("" = the preset's own weights; workers.abnet.encoder_init).
    encoder_init: str = field(default="", metadata=PATH)
    # "synthetic": a seeded toy translation task (tests, tiny); "corpus": `data build` output.
    data: Literal["synthetic", "corpus"] = "synthetic"
    # Where `nebula-mq data build` wrote the corpus (data = "corpus").
    data_dir: str = field(default="run/data", metadata=PATH)
    # The corpus split training reads.
    split: str = "train"
    # Sentence pairs per micro-batch (the global batch, cut among the ranks).
    batch_size: int = 16
    # "length": batches of similar source length (less padding); "random": plain shuffling;
    # "auto": length on the corpus, random on the synthetic task (its sentences are all short).
    batching: Literal["auto", "length", "random"] = "auto"
    # Synthetic task only: source length range and vocabulary come from the tiny preset.
    synthetic_len: int = 8
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
    # The data split the evaluation's samples come from.
    eval_split: str = "test"
    # Domains the evaluation draws from (empty = every domain of eval_split).
    eval_domains: tuple[str, ...] = ()
    # Beam width of the evaluation's decoding on T.
    eval_beam: int = 4
    # Longest translation the evaluation decodes, in target tokens.
    eval_max_len: int = 64
    # Linear warm-up of the learning rate over the first updates (0 = none; the small and full
    # presets default to 400: PRESET_SCHEDULES). Without it, Adam at 1e-3 can push their
    # encoder adapters to a constant output in a few dozen steps (every token the same vector:
    # the decoder then ignores the source).
    warmup_steps: int = 0
    # After warm-up: "none" keeps lr; "cosine"/"linear" decay it to lr * min_lr_ratio at
    # the job's last step (small and full default to cosine). A constant 1e-3 learnt and then
    # diverged in the 60-minute run.
    lr_decay: Literal["none", "cosine", "linear"] = "none"
    # The learning rate lr_decay ends at, as a fraction of lr.
    min_lr_ratio: float = 0.1
    # Each side clips its adapters' gradients to this global norm before its step (0 = off).
    # Each side clips its own: the two halves have separate optimizers, as in the paper.
    grad_clip: float = 1.0
    # What the encoder does when every token gets the same vector (see docs/quality.md):
    # "stop" fails the job before it overwrites good checkpoints; "warn" logs and goes on.
    on_collapse: Literal["stop", "warn"] = "stop"

    def validate(self) -> None:
        super().validate()
        if self.batch_size < 1:
            raise ValueError("batch_size >= 1")
        if self.batch_size % (self.head_ranks * self.tail_ranks):
            raise ValueError("batch_size a multiple of encoder_ranks x decoder_ranks (each rank its equal share)")
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


def adapter_optimizer(job: AbnetJob, parameters: list[paddle.Tensor]) -> paddle.optimizer.Optimizer:
    """One side's optimizer: AdamW without weight decay (adapters start near zero), its
    gradients clipped to ``grad_clip`` global norm."""
    import paddle  # here, not at the top: the launcher reads this module (plans) without paddle

    clip = paddle.nn.ClipGradByGlobalNorm(job.grad_clip) if job.grad_clip > 0 else None
    return paddle.optimizer.AdamW(learning_rate=job.lr, parameters=parameters, weight_decay=0.0, grad_clip=clip)


# The learning-rate schedule each preset trains at where the job file sets none (measured:
# docs/quality.md, "The collapse guard"). The tiny model learns at the split job's lr 1e-3
# straight away (and at 3e-3; 1e-2 collapses its encoder). The pretrained models' adapters
# collapse at 1e-3 without warm-up within ~120 steps; warmed up over 400 and decayed (the
# 60-minute run's schedule) they learn without collapse.
PRESET_SCHEDULES: dict[str, dict[str, object]] = {
    "tiny": {},
    "small": {"warmup_steps": 400, "lr_decay": "cosine"},
    "full": {"warmup_steps": 400, "lr_decay": "cosine"},
}


def load_job(settings: Settings) -> AbnetJob:
    where = settings.source or "<settings>"
    section = dict(settings.section("abnet"))
    for old, new in PLACEMENT_ALIASES.items():
        if old in section:
            if new in section:
                raise ConfigError(where, f"abnet.{old}", f"one of {old} and {new} (the same setting)",
                                  section[old])
            section[new] = section.pop(old)
    # The preset's schedule, for what the job file leaves out.
    schedule = PRESET_SCHEDULES.get(str(section.get("preset", "tiny")), {})
    return config.build(AbnetJob, {**schedule, **section}, where, "abnet.")


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
            full = only_domains(full, domains, path)
        if split == job.split and job.max_source_tokens and side == "src":
            full = {k: v[full["src_mask"].sum(axis=1) <= job.max_source_tokens] for k, v in full.items()}
        arrays = {k: v[:limit] if limit else v for k, v in full.items()
                  if k in ("index", "domain") or k.startswith(f"{side}_")}
    by_length = job.batching == "length" or (job.batching == "auto" and job.data == "corpus")
    return TranslationData(arrays, job.batch_size, seed, by_length=by_length)


def model_config(job: AbnetJob, seed: int) -> ABNetConfig:
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
