"""ABNet split across two clusters (paper §3.2, Fig. 5).

* :class:`EncoderSide` (cluster S): frozen e5-small + feed-forward adapters;
  its output ``enc_out`` [B, S, 384] is the activation that crosses the WAN.
* :class:`DecoderSide` (cluster T): frozen MiniLM run as a causal decoder +
  cross-attention adapters + LM head; computes the loss and d loss / d enc_out,
  the gradient that goes back.
* :class:`ABNet`: both sides in one process (joint training, inference).

Neither side steps an optimizer: the worker owns optimizers, gradient clearing
and accumulation. Gradients accumulate across calls, as in paddle.

LM head: BERT's MLM-head shape, a trainable transform (Linear, GELU, LN) and
a trainable output bias, with logits against the **frozen, tied** MiniLM word
embeddings. A fully trainable 30,522 x 384 output matrix would add 11.7M
trainable parameters (more than all adapters together) and throw away the
target-side lexical knowledge; the transform is needed because MiniLM was
never trained against an output layer (the checkpoint has no MLM head).
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from nebula_mq.errors import ShapeMismatch
from nebula_mq.models.abnet_config import ENCODER_WEIGHTS, ABNetConfig, StackConfig, check_shape
from nebula_mq.models.adapters import CrossAttentionAdapter, EncoderAdapter
from nebula_mq.models.beam_search import StepFn, beam_search, greedy_search
from nebula_mq.models.bert import (Adapter, BertConfig, BertEncoder, Memory, causal_bias, freeze,
                                   load_numpy_state, padding_bias)
from nebula_mq.models.pretrained import PrunedVocab, PretrainedWeights, load_e5_small, load_minilm


def _load_stack(side: str, cfg: StackConfig, keep_ids: np.ndarray | None) -> tuple[BertEncoder, PrunedVocab | None]:
    """Frozen BERT stack, pretrained (optionally vocabulary-pruned) or seeded random."""
    weights: PretrainedWeights | None = None
    if cfg.weights in ENCODER_WEIGHTS:
        weights = load_e5_small(ENCODER_WEIGHTS[cfg.weights], keep_ids=keep_ids, layers=cfg.layers)
    elif cfg.weights == "minilm":
        weights = load_minilm(layers=cfg.layers)
    if weights is not None:
        check_shape(side, cfg, weights.shape)
        bert_cfg = BertConfig.from_shape(weights.shape)
    else:
        bert_cfg = BertConfig(cfg.vocab, cfg.hidden, cfg.layers, cfg.heads, cfg.ffn, cfg.positions,
                              layer_norm_eps=cfg.layer_norm_eps)
    stack = BertEncoder(bert_cfg)
    if weights is not None:
        load_numpy_state(stack, weights.tensors)
    freeze(stack)
    return stack, (weights.vocab if weights is not None else None)


def _insert(stack: BertEncoder, sites: tuple[str, ...], make: type[Adapter] | object) -> None:
    for layer in stack.layers:
        for site in sites:
            setattr(layer, f"after_{site}", make())  # type: ignore[operator]


def log_softmax(logits: paddle.Tensor) -> paddle.Tensor:
    """log-softmax over the last axis as x - logsumexp(x).

    paddle 3.3's CPU ``F.log_softmax`` kernel takes ~50 s forward for a
    [16, 32, 30522] tensor (measured); this form takes 0.2 s and agrees to 2e-6.
    """
    return logits - paddle.logsumexp(logits, axis=-1, keepdim=True)


def _trainable(layer: nn.Layer) -> list[paddle.Tensor]:
    return [p for p in layer.parameters() if not p.stop_gradient]


class EncoderSide(nn.Layer):
    """Cluster S. ``src_keep_ids``: corpus token ids (XLM-R space) to keep when pruning."""

    def __init__(self, cfg: ABNetConfig, src_keep_ids: np.ndarray | list[int] | None = None) -> None:
        super().__init__()
        paddle.seed(cfg.seed)
        self.cfg = cfg
        keep = None if src_keep_ids is None else np.asarray(src_keep_ids, dtype=np.int64)
        self.stack, self.vocab = _load_stack("encoder", cfg.encoder, keep)
        h = cfg.encoder.hidden
        _insert(self.stack, cfg.encoder.adapter_sites,
                lambda: EncoderAdapter(h, cfg.adapter_hidden, cfg.adapter_dropout, cfg.adapter_out_std))

    def forward(self, src_ids: np.ndarray, src_mask: np.ndarray) -> paddle.Tensor:
        """src_ids [B, S] in the tokenizer's (unpruned) id space, src_mask [B, S] 1/0 -> enc_out [B, S, H]."""
        ids = np.asarray(src_ids, dtype=np.int64)
        if self.vocab is not None:
            ids = self.vocab.old_to_new(ids)
        mask = paddle.to_tensor(np.asarray(src_mask, dtype=np.float32))
        return self.stack(paddle.to_tensor(ids), padding_bias(mask))

    def backward(self, enc_out: paddle.Tensor, grad: np.ndarray) -> None:
        """Back-propagate the gradient received from cluster T into the adapters."""
        if tuple(grad.shape) != tuple(enc_out.shape):
            raise ShapeMismatch(f"gradient shape {tuple(grad.shape)} != activation shape {tuple(enc_out.shape)}")
        enc_out.backward(paddle.to_tensor(np.asarray(grad, dtype=np.float32)))

    def trainable_parameters(self) -> list[paddle.Tensor]:
        return _trainable(self)


class LMHead(nn.Layer):
    """Transform + logits against the tied (frozen) decoder word embeddings."""

    def __init__(self, word: paddle.Tensor, hidden: int) -> None:
        super().__init__()
        # [V, H], owned by the decoder embeddings: kept in a tuple so paddle does not
        # register it a second time (state_dict would hold the 11.7M floats twice).
        self._tied = (word,)
        self.transform = nn.Linear(hidden, hidden)
        self.ln = nn.LayerNorm(hidden, epsilon=1e-12)
        self.bias = self.create_parameter([word.shape[0]], is_bias=True)

    def forward(self, h: paddle.Tensor) -> paddle.Tensor:
        z = self.ln(F.gelu(self.transform(h)))  # [B, T, H]
        return paddle.matmul(z, self._tied[0], transpose_y=True) + self.bias  # [B, T, V]


class DecoderSide(nn.Layer):
    """Cluster T. Targets are [B, T] = BOS, tokens, EOS, then padding."""

    def __init__(self, cfg: ABNetConfig) -> None:
        super().__init__()
        paddle.seed(cfg.seed + 1)
        self.cfg = cfg
        self.stack, _ = _load_stack("decoder", cfg.decoder, None)
        d, e = cfg.decoder, cfg.encoder
        _insert(self.stack, d.adapter_sites, lambda: CrossAttentionAdapter(
            d.hidden, e.hidden, d.heads, cfg.adapter_hidden, cfg.adapter_dropout, cfg.adapter_out_std))
        self.head = LMHead(self.stack.embeddings.word.weight, d.hidden)

    def logits(self, enc_out: paddle.Tensor, enc_mask: paddle.Tensor, tgt_in: paddle.Tensor) -> paddle.Tensor:
        """enc_out [B, S, He], enc_mask [B, S], tgt_in [B, T] -> logits [B, T, V]."""
        memory = Memory(enc_out, padding_bias(enc_mask))
        tgt_mask = paddle.cast(tgt_in != self.cfg.tgt_pad_id, "float32")
        h = self.stack(tgt_in, causal_bias(tgt_mask), memory)  # [B, T, H]
        return self.head(h)

    def loss(self, enc_out: paddle.Tensor, enc_mask: np.ndarray, tgt_ids: np.ndarray) -> paddle.Tensor:
        """Mean token cross entropy (label smoothing per config) over non-pad target tokens."""
        tgt = np.asarray(tgt_ids, dtype=np.int64)
        if tgt.ndim != 2 or tgt.shape[1] < 2 or tgt.shape[0] != enc_out.shape[0]:
            raise ShapeMismatch(f"targets must be [B={enc_out.shape[0]}, T>=2], got {tgt.shape}")
        mask = paddle.to_tensor(np.asarray(enc_mask, dtype=np.float32))
        logp = log_softmax(self.logits(enc_out, mask, paddle.to_tensor(tgt[:, :-1])))  # [B, T-1, V]
        labels = paddle.to_tensor(tgt[:, 1:]).unsqueeze(-1)  # [B, T-1, 1]
        nll = -paddle.take_along_axis(logp, labels, axis=-1).squeeze(-1)  # [B, T-1]
        eps = self.cfg.label_smoothing
        per_token = (1.0 - eps) * nll - eps * logp.mean(axis=-1) if eps else nll
        keep = paddle.to_tensor((tgt[:, 1:] != self.cfg.tgt_pad_id).astype(np.float32))
        return (per_token * keep).sum() / paddle.clip(keep.sum(), min=1.0)

    def loss_and_grad(self, enc_out_np: np.ndarray, enc_mask_np: np.ndarray,
                      tgt_ids_np: np.ndarray) -> tuple[float, np.ndarray]:
        """Loss on a received activation; backward into the adapters; d loss / d enc_out."""
        enc_out = paddle.to_tensor(np.asarray(enc_out_np, dtype=np.float32), stop_gradient=False)
        loss = self.loss(enc_out, enc_mask_np, tgt_ids_np)
        loss.backward()
        return float(loss), enc_out.grad.numpy()

    def next_token_scorer(self, enc_out_np: np.ndarray, enc_mask_np: np.ndarray) -> StepFn:
        """A no-grad ``step(prefix, rows) -> log-probs [N, V]`` for the search functions."""
        enc = paddle.to_tensor(np.asarray(enc_out_np, dtype=np.float32))
        mask = paddle.to_tensor(np.asarray(enc_mask_np, dtype=np.float32))
        never = [self.cfg.tgt_bos_id, self.cfg.tgt_pad_id]

        def step(prefix: np.ndarray, rows: np.ndarray) -> np.ndarray:
            idx = paddle.to_tensor(rows)
            with paddle.no_grad():
                logits = self.logits(paddle.gather(enc, idx), paddle.gather(mask, idx), paddle.to_tensor(prefix))
                logp = log_softmax(logits[:, -1]).numpy()  # [N, V]
            logp[:, never] = -np.inf  # BOS and padding are never generated
            return logp

        return step

    def decode(self, enc_out_np: np.ndarray, enc_mask_np: np.ndarray, beam: int = 4,
               max_len: int = 64, alpha: float = 1.0) -> list[list[int]]:
        """Translate from a received activation; beam=1 is greedy. Outputs exclude BOS/EOS."""
        was_training = self.training
        self.eval()
        step, c, batch = self.next_token_scorer(enc_out_np, enc_mask_np), self.cfg, len(enc_out_np)
        try:
            if beam == 1:
                return greedy_search(step, batch, c.tgt_bos_id, c.tgt_eos_id, max_len)
            return beam_search(step, batch, c.tgt_bos_id, c.tgt_eos_id, max_len, beam, alpha)
        finally:
            self.train(was_training)

    def trainable_parameters(self) -> list[paddle.Tensor]:
        return _trainable(self)


class ABNet(nn.Layer):
    """Both sides in one process: joint loss (the reference for the split) and translation."""

    def __init__(self, cfg: ABNetConfig, src_keep_ids: np.ndarray | list[int] | None = None) -> None:
        super().__init__()
        self.encoder = EncoderSide(cfg, src_keep_ids)
        self.decoder = DecoderSide(cfg)

    def loss(self, src_ids: np.ndarray, src_mask: np.ndarray, tgt_ids: np.ndarray) -> paddle.Tensor:
        return self.decoder.loss(self.encoder(src_ids, src_mask), src_mask, tgt_ids)

    def translate(self, src_ids: np.ndarray, src_mask: np.ndarray, beam: int = 4,
                  max_len: int = 64, alpha: float = 1.0) -> list[list[int]]:
        was_training = self.encoder.training
        self.encoder.eval()
        with paddle.no_grad():
            enc = self.encoder(src_ids, src_mask).numpy()
        self.encoder.train(was_training)
        return self.decoder.decode(enc, src_mask, beam, max_len, alpha)

    def trainable_parameters(self) -> list[paddle.Tensor]:
        return self.encoder.trainable_parameters() + self.decoder.trainable_parameters()
