"""Training steps of the two sides of Scenario I, as the workers call them.

Which optimiser each term of eq. 11 (L_G + λ·L_D + γ·L_CLM) updates:

* L_G depends only on θ_G and the sampled replacements are discrete (no
  gradient flows from D back to G), so ∂(eq. 11)/∂θ_G = ∂L_G/∂θ_G: the
  generator's optimiser, on cluster A, minimises L_G alone.
* L_D and L_CLM depend only on θ_D, so ∂(eq. 11)/∂θ_D = λ∂L_D/∂θ_D + γ∂L_CLM/∂θ_D:
  the discriminator's optimiser, on cluster B, minimises λ·L_D + γ·L_CLM.

Joint minimisation therefore splits exactly into two independent optimisers,
which is what lets the data flow one way (G → D). The discriminator receives
L_G's value in the micro-batch only to log the total of eq. 11.

A micro-batch (what crosses the WAN, as numpy): ``input_ids`` (corrupted, int32),
``labels`` (original ids, int32), ``replaced`` (uint8, sampled ≠ original),
``masked_positions`` (uint8, the set M), ``attention_mask`` (uint8), ``mlm_loss``
(float32 [1]).

Randomness: masking and sampling draw from ``np.random.default_rng`` seeded
with ``(config seed, generator seed, generator index, step, micro-batch)``, and
there is no dropout, so a step is a pure function of (state, input): nothing
random needs checkpointing, and resuming replays bit-identically.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import paddle
from paddle import nn
from paddle.base.unique_name import UniqueNameGenerator
from paddle.utils import unique_name

from nebula_mq.errors import CheckpointError, DataError, MalformedMessage, ShapeMismatch, WorkerError
from nebula_mq.models.bert import padding_bias
from nebula_mq.models.electra import (TASKS, XLMR_SPECIALS, Discriminator, ElectraConfig, Generator, corrupt,
                                      gather_positions, mask_batch, replaced_token_loss, rtd_accuracy,
                                      sample_from_logits, token_cross_entropy)

MICRO_BATCH_KEYS = ("input_ids", "labels", "replaced", "masked_positions", "attention_mask", "mlm_loss")
# Called between backward and the optimiser step (data parallelism all-reduces here).
GradientSync = Callable[[nn.Layer], None]


def init_bert_style(model: nn.Layer, seed: int) -> None:
    """N(0, 0.02) clipped at 2σ for matrices and embeddings, zeros for biases, ones for LN scales.

    Drawn with numpy from ``seed`` so initial weights do not depend on paddle's global RNG.
    """
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        if len(shape) >= 2:
            p.set_value(np.clip(rng.normal(0.0, 0.02, shape), -0.04, 0.04).astype(np.float32))
        elif name.endswith("ln.weight"):
            p.set_value(np.ones(shape, np.float32))
        else:
            p.set_value(np.zeros(shape, np.float32))


class _Trainer:
    """Model + AdamW + linear warm-up/decay schedule + step counter, checkpointable as arrays."""

    def __init__(self, cfg: ElectraConfig, build: Callable[[], nn.Layer], lr: float, seed: int) -> None:
        if cfg.vocab_size < 1:
            raise DataError("vocab_size is 0: call ElectraConfig.with_pruned_vocab(kept_ids) first")
        self.cfg, self.base_lr, self.step = cfg, lr, 0
        # A private name generator: parameter and accumulator names (the optimiser's
        # state keys) are then the same in every process, whatever was built before.
        self._names = UniqueNameGenerator()
        with unique_name.guard(self._names):
            self.model = build()
            init_bert_style(self.model, seed)
            no_decay = {p.name for n, p in self.model.named_parameters() if len(p.shape) < 2}
            self.optimizer = paddle.optimizer.AdamW(
                learning_rate=lr, parameters=self.model.parameters(), weight_decay=cfg.weight_decay,
                apply_decay_param_fun=lambda pname: pname not in no_decay)
        self._pending_optimizer: dict[str, np.ndarray] = {}

    def lr_at(self, step: int) -> float:
        c = self.cfg
        warm = min(1.0, (step + 1) / max(1, c.warmup_steps))
        decay = max(0.0, (c.total_steps - step) / max(1, c.total_steps - c.warmup_steps))
        return self.base_lr * min(warm, decay)

    def _optimizer_step(self) -> float:
        lr = self.lr_at(self.step)
        with unique_name.guard(self._names):
            self.optimizer.set_lr(lr)
            self.optimizer.step()
            self.optimizer.clear_grad()
        self._pending_optimizer = {}
        self.step += 1
        return lr

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Model + optimiser + step as named numpy arrays (for ``CheckpointStore.save``)."""
        out = {f"model/{n}": p.numpy() for n, p in self.model.named_parameters()}
        opt = {k: v.numpy() for k, v in self.optimizer.state_dict().items() if isinstance(v, paddle.Tensor)}
        out.update({f"optim/{k}": v for k, v in (opt or self._pending_optimizer).items()})
        out["trainer/step"] = np.array([self.step], dtype=np.int64)
        return out

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        params = dict(self.model.named_parameters())
        missing = sorted(f"model/{n}" for n in params if f"model/{n}" not in arrays)
        if missing or "trainer/step" not in arrays:
            raise CheckpointError(f"state lacks {(missing or ['trainer/step'])[:3]} (of {len(missing)} missing)")
        for n, p in params.items():
            value = np.asarray(arrays[f"model/{n}"])
            if value.shape != tuple(p.shape):
                raise CheckpointError(f"model/{n}: shape {value.shape}, parameter is {tuple(p.shape)}")
            p.set_value(value.astype(np.float32, copy=False))
        self._pending_optimizer = {k[6:]: np.asarray(v) for k, v in arrays.items() if k.startswith("optim/")}
        if self._pending_optimizer:
            self.optimizer.set_state_dict({k: paddle.to_tensor(v) for k, v in self._pending_optimizer.items()})
        self.step = int(np.asarray(arrays["trainer/step"]).reshape(-1)[0])


class GeneratorTrainer(_Trainer):
    """Cluster A: masks, trains the MLM generator, samples replacements, emits micro-batches."""

    def __init__(self, cfg: ElectraConfig, index: int = 0, gradient_sync: GradientSync | None = None) -> None:
        if not 0 <= index < len(cfg.generators):
            raise DataError(f"generator index {index} outside 0..{len(cfg.generators) - 1}")
        self.index, self.gen = index, cfg.generators[index]
        self.task = TASKS[self.gen.task]
        super().__init__(cfg, lambda: Generator(cfg, self.gen), self.gen.lr, cfg.seed * 1009 + self.gen.seed)
        self._micro = 0
        self.gradient_sync = gradient_sync  # data parallelism among generator replicas (paper §3.3)

    def build_inputs(self, examples: Sequence[Any]) -> np.ndarray:
        """Raw examples of this generator's task -> [B, max_len] ids."""
        return self.task.build_inputs(examples, self.cfg)

    def _rng(self, tag: int) -> np.random.Generator:
        return np.random.default_rng([self.cfg.seed, self.gen.seed, self.index, self.step, tag])

    def _forward(self, ids: np.ndarray, attention_mask: np.ndarray | None, rng: np.random.Generator,
                 ) -> tuple[dict[str, np.ndarray], paddle.Tensor, dict[str, float]]:
        ids = _check_ids(ids, self.cfg)
        mb = mask_batch(ids, rng, self.cfg.vocab, self.cfg.mask_prob, attention_mask)
        if not mb.positions.any():
            raise DataError("batch has no maskable token (only special ids or padding)")
        attn = (ids != self.cfg.pad_id) if attention_mask is None else np.asarray(attention_mask).astype(bool)
        states = self.model.encoder(paddle.to_tensor(mb.masked_ids.astype(np.int64)),
                                    padding_bias(paddle.to_tensor(attn.astype(np.float32))))
        logits = self.model.mlm(gather_positions(states, mb.positions))  # [N, V]
        targets = mb.labels[mb.positions]
        loss = token_cross_entropy(logits, targets)
        logits_np = logits.numpy()
        corrupted, replaced = corrupt(mb, sample_from_logits(logits_np, rng, self.cfg.special_ids))
        loss_value = float(loss.numpy())
        batch = {"input_ids": corrupted, "labels": mb.labels, "replaced": replaced,
                 "masked_positions": mb.positions.astype(np.uint8), "attention_mask": attn.astype(np.uint8),
                 "mlm_loss": np.array([loss_value], dtype=np.float32)}
        metrics = {"mlm_loss": loss_value, "mlm_acc": float((logits_np.argmax(axis=1) == targets).mean()),
                   "replaced_frac": float(replaced.sum() / max(1, attn.sum()))}
        return batch, loss, metrics

    def make_micro_batch(self, ids: np.ndarray, attention_mask: np.ndarray | None = None,
                         ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Forward + backward (gradients accumulate) on one micro-batch; returns what goes to D."""
        if self._micro >= self.gen.micro_batches:
            raise WorkerError(f"{self._micro} micro-batches already made: call apply_update() first")
        with unique_name.guard(self._names):
            batch, loss, metrics = self._forward(ids, attention_mask, self._rng(self._micro))
            (loss / self.gen.micro_batches).backward()
        self._micro += 1
        return batch, metrics

    def apply_update(self) -> dict[str, float]:
        """The optimiser step after exactly ``micro_batches`` micro-batches."""
        if self._micro != self.gen.micro_batches:
            raise WorkerError(f"apply_update after {self._micro} of {self.gen.micro_batches} micro-batches")
        self._micro = 0
        if self.gradient_sync is not None:
            self.gradient_sync(self.model)
        return {"lr": self._optimizer_step(), "step": float(self.step)}

    def train_step(self, ids: np.ndarray, attention_mask: np.ndarray | None = None,
                   ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """make_micro_batch + apply_update, for a generator with micro_batches = 1."""
        batch, metrics = self.make_micro_batch(ids, attention_mask)
        return batch, {**metrics, **self.apply_update()}

    @paddle.no_grad()
    def corrupt_without_training(self, ids: np.ndarray, seed: int, attention_mask: np.ndarray | None = None,
                                 ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """A micro-batch from the current generator, no gradients (evaluation, held-out data)."""
        batch, _, metrics = self._forward(ids, attention_mask, np.random.default_rng([seed, 7919]))
        return batch, metrics

    def evaluate(self, batches: Sequence[np.ndarray], seed: int = 12345) -> dict[str, float]:
        """Held-out MLM accuracy / loss, averaged over ``batches`` (fixed masking seed)."""
        runs = [self.corrupt_without_training(ids, seed + i)[1] for i, ids in enumerate(batches)]
        return {k: float(np.mean([r[k] for r in runs])) for k in ("mlm_loss", "mlm_acc")}


class DiscriminatorTrainer(_Trainer):
    """Cluster B: RTD + corrective LM on micro-batches from any generator."""

    def __init__(self, cfg: ElectraConfig, pretrained: Mapping[str, np.ndarray] | None = None,
                 gradient_sync: GradientSync | None = None) -> None:
        if cfg.init == "e5-small" and pretrained is None:
            raise DataError("init = 'e5-small' needs the pretrained tensors (see e5_discriminator_init)")
        super().__init__(cfg, lambda: Discriminator(cfg), cfg.disc_lr, cfg.seed * 1009)
        if pretrained is not None:
            from nebula_mq.models.bert import load_numpy_state

            load_numpy_state(self.model.encoder, dict(pretrained))
        self.gradient_sync = gradient_sync

    def _losses(self, batch: Mapping[str, np.ndarray]) -> tuple[paddle.Tensor, paddle.Tensor, dict[str, float]]:
        b = _check_micro_batch(batch, self.cfg)
        attn = b["attention_mask"].astype(bool)
        positions = b["masked_positions"].astype(bool)
        states = self.model.encoder(paddle.to_tensor(b["input_ids"].astype(np.int64)),
                                    padding_bias(paddle.to_tensor(attn.astype(np.float32))))
        rtd_logits = self.model.rtd(states).squeeze(-1)  # [B, T]
        clm_logits = self.model.clm(gather_positions(states, positions))  # [N, V]
        targets = b["labels"][positions]
        l_d = replaced_token_loss(rtd_logits, b["replaced"], attn)
        l_clm = token_cross_entropy(clm_logits, targets)
        metrics = rtd_accuracy(rtd_logits.numpy(), b["replaced"], attn)
        metrics["clm_acc"] = float((clm_logits.numpy().argmax(axis=1) == targets).mean()) if len(targets) else 0.0
        return l_d, l_clm, metrics

    def train_step(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """One optimiser step on λ·L_D + γ·L_CLM; metrics include eq. 11's total with L_G from G."""
        c = self.cfg
        with unique_name.guard(self._names):
            l_d, l_clm, metrics = self._losses(batch)
            loss = c.rtd_weight * l_d + c.clm_weight * l_clm
            loss.backward()
            if self.gradient_sync is not None:
                self.gradient_sync(self.model)
        lr = self._optimizer_step()
        mlm = float(np.asarray(batch["mlm_loss"]).reshape(-1)[0])
        rtd, clm = float(l_d.numpy()), float(l_clm.numpy())
        return {**metrics, "rtd_loss": rtd, "clm_loss": clm, "disc_loss": float(loss.numpy()), "mlm_loss": mlm,
                "total_loss": mlm + c.rtd_weight * rtd + c.clm_weight * clm, "lr": lr, "step": float(self.step)}

    @paddle.no_grad()
    def evaluate(self, batches: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
        """RTD / CLM accuracy and losses on held-out micro-batches, averaged."""
        runs = []
        for batch in batches:
            l_d, l_clm, m = self._losses(batch)
            runs.append({**m, "rtd_loss": float(l_d.numpy()), "clm_loss": float(l_clm.numpy())})
        return {k: float(np.mean([r[k] for r in runs])) for k in runs[0]} if runs else {}


def e5_discriminator_init(cfg: ElectraConfig, corpus_ids: np.ndarray,
                          ) -> tuple[ElectraConfig, dict[str, np.ndarray], np.ndarray]:
    """Load multilingual-e5-small pruned to the corpus' XLM-R ids.

    Returns the config with the pruned vocabulary, the encoder tensors for
    :class:`DiscriminatorTrainer`, and the kept original ids (new id = index;
    map corpus ids with ``np.searchsorted``-style lookup or PrunedVocab.old_to_new).
    """
    from nebula_mq.models.pretrained import load_e5_small

    keep = np.union1d(np.asarray(corpus_ids, dtype=np.int64).ravel(), list(XLMR_SPECIALS.values()))
    weights = load_e5_small(keep_ids=keep, layers=cfg.discriminator.layers)
    s = weights.shape
    d = cfg.discriminator
    if (s.hidden, s.heads, s.ffn) != (d.hidden, d.heads, d.ffn):
        raise DataError(f"discriminator size {d} does not match e5-small {s}")
    if weights.vocab is None:
        raise DataError("e5-small loader returned an unpruned vocabulary")
    return cfg.with_pruned_vocab(weights.vocab.kept_ids), weights.tensors, weights.vocab.kept_ids


def _check_ids(ids: np.ndarray, cfg: ElectraConfig) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.shape[1] > 512 or not np.issubdtype(ids.dtype, np.integer):
        raise ShapeMismatch(f"ids must be integer [batch, seq<=512], got {ids.dtype} {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= cfg.vocab_size):
        raise MalformedMessage(f"token ids outside [0, {cfg.vocab_size}): [{ids.min()}, {ids.max()}]")
    return ids


def _check_micro_batch(batch: Mapping[str, np.ndarray], cfg: ElectraConfig) -> dict[str, np.ndarray]:
    missing = [k for k in MICRO_BATCH_KEYS if k not in batch]
    if missing:
        raise MalformedMessage(f"micro-batch lacks {missing}")
    b = {k: np.asarray(batch[k]) for k in MICRO_BATCH_KEYS}
    shape = _check_ids(b["input_ids"], cfg).shape
    for k in ("labels", "replaced", "masked_positions", "attention_mask"):
        if b[k].shape != shape:
            raise ShapeMismatch(f"micro-batch {k!r} shape {b[k].shape} != input_ids {shape}")
    _check_ids(b["labels"], cfg)
    if not b["masked_positions"].any():
        raise MalformedMessage("micro-batch has no masked position")
    return b
