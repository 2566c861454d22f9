"""ABNet split across two clusters (paper §3.2, Fig. 5).

* :class:`EncoderSide` (cluster S): frozen e5-small + feed-forward adapters;
  its output ``enc_out`` [B, S, 384] is the activation that crosses the WAN.
* :class:`DecoderSide` (cluster T): frozen MiniLM run as a causal decoder +
  cross-attention adapters + LM head; computes the loss and d loss / d enc_out,
  the gradient that goes back.
* :class:`ABNet`: both sides in one process (joint training, inference).

The adapters are the only trainable parts of the two pretrained stacks: each is an
:class:`~nebula_mq.models.bert.Adapter` in a slot of a frozen BertLayer, its last
projection initialised with a small std (``out_std``) so that, at step 0, it is close to
the identity and the pretrained model's behaviour is preserved.

Decoding: :class:`CachedScorer` decodes one token at a time against a key/value cache of
the positions already decoded (exact: the decoder is causal). For sentences of t tokens it
costs O(t) decoder passes of one position instead of O(t^2) positions, and projects the
source memory for cross-attention once per sentence. :class:`PrefixScorer` re-runs every
prefix whole; the tests use it as the reference the cached scorer must agree with.

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

import collections

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from nebula_mq.errors import ShapeMismatch
from nebula_mq.models.abnet_config import ENCODER_WEIGHTS, ABNetConfig, StackConfig, check_shape
from nebula_mq.models.beam_search import StepFn, beam_search, greedy_search
from nebula_mq.models.bert import (Adapter, BertConfig, BertEncoder, LayerPast, Memory, MultiHeadAttention,
                                   causal_bias, freeze, load_numpy_state, padding_bias)
from nebula_mq.models.pretrained import PrunedVocab, PretrainedWeights, load_e5_small, load_minilm


# Frozen-part outputs an EncoderSide remembers: enough for a window of micro-batches in
# flight (each is computed at send time and again at apply time).
FROZEN_CACHE_ENTRIES = 16


def _load_stack(side: str, cfg: StackConfig, keep_ids: np.ndarray | None) -> tuple[BertEncoder, PrunedVocab | None]:
    """Frozen BERT stack, pretrained (optionally vocabulary-pruned) or seeded random."""
    weights: PretrainedWeights | None = None
    if cfg.weights in ENCODER_WEIGHTS:
        weights = load_e5_small(ENCODER_WEIGHTS[cfg.weights], keep_ids=keep_ids, layers=cfg.layers)
    elif cfg.weights == "minilm":
        weights = load_minilm(layers=cfg.layers, keep_ids=keep_ids)
    if weights is not None:
        check_shape(side, cfg, weights.shape)
        bert_cfg = weights.shape
    else:
        bert_cfg = BertConfig(cfg.vocab, cfg.hidden, cfg.layers, cfg.heads, cfg.ffn, cfg.positions,
                              layer_norm_eps=cfg.layer_norm_eps)
    stack = BertEncoder(bert_cfg)
    if weights is not None:
        load_numpy_state(stack, weights.tensors)
    freeze(stack)
    return stack, (weights.vocab if weights is not None else None)


def _insert(stack: BertEncoder, cfg: StackConfig, make: type[Adapter] | object) -> None:
    for layer in list(stack.layers)[cfg.first_adapted:]:
        for site in cfg.adapter_sites:
            setattr(layer, f"after_{site}", make())  # type: ignore[operator]


class _Trained(nn.Layer):
    """A side (or both) of ABNet, whose only trainable parts are the adapters and the LM head."""

    def trainable_parameters(self) -> list[paddle.Tensor]:
        return [p for p in self.parameters() if not p.stop_gradient]


def _small_init(linear: nn.Linear, std: float) -> None:
    linear.weight.set_value(paddle.normal(0.0, std, linear.weight.shape) if std > 0 else paddle.zeros(linear.weight.shape))
    linear.bias.set_value(paddle.zeros(linear.bias.shape))


class FeedForwardAdapter(nn.Layer):
    """h + W2 relu(W1 LN(h)): LayerNorm and two feed-forward layers with a residual."""

    def __init__(self, hidden: int, inner: int, dropout: float, out_std: float, eps: float = 1e-12) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden, epsilon=eps)
        self.inner = nn.Linear(hidden, inner)
        self.outer = nn.Linear(inner, hidden)
        self.dropout = nn.Dropout(dropout)
        _small_init(self.outer, out_std)

    def forward(self, h: paddle.Tensor) -> paddle.Tensor:
        return h + self.dropout(self.outer(F.relu(self.inner(self.ln(h)))))  # [B, T, H]


class EncoderAdapter(Adapter):
    """Encoder-side adapter (A_ENC): a feed-forward adapter; ignores the memory."""

    def __init__(self, hidden: int, inner: int, dropout: float = 0.0, out_std: float = 0.01) -> None:
        super().__init__()
        self.ffn = FeedForwardAdapter(hidden, inner, dropout, out_std)

    def forward(self, h: paddle.Tensor, memory: Memory | None) -> paddle.Tensor:
        return self.ffn(h)  # [B, T, H]


class CrossAttentionAdapter(Adapter):
    """Decoder-side adapter (A_DEC): h + CrossAttn(LN(h), enc) then a feed-forward adapter."""

    def __init__(self, hidden: int, enc_hidden: int, heads: int, inner: int,
                 dropout: float = 0.0, out_std: float = 0.01) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden, epsilon=1e-12)
        self.cross = MultiHeadAttention(hidden, heads, kv_hidden=enc_hidden)
        self.dropout = nn.Dropout(dropout)
        self.ffn = FeedForwardAdapter(hidden, inner, dropout, out_std)
        _small_init(self.cross.output, out_std)

    def forward(self, h: paddle.Tensor, memory: Memory | None) -> paddle.Tensor:
        if memory is None:
            raise ValueError("CrossAttentionAdapter needs the encoder memory")
        h = h + self.dropout(self.cross.attend_kv(self.ln(h), *memory.keys_values(self.cross), memory.bias))  # [B, T, H]
        return self.ffn(h)


class EncoderSide(_Trained):
    """Cluster S. ``src_keep_ids``: corpus token ids (XLM-R space) to keep when pruning."""

    def __init__(self, cfg: ABNetConfig, src_keep_ids: np.ndarray | list[int] | None = None) -> None:
        super().__init__()
        paddle.seed(cfg.seed)
        self.cfg = cfg
        keep = None if src_keep_ids is None else np.asarray(src_keep_ids, dtype=np.int64)
        self.stack, self.vocab = _load_stack("encoder", cfg.encoder, keep)
        h = cfg.encoder.hidden
        _insert(self.stack, cfg.encoder,
                lambda: EncoderAdapter(h, cfg.adapter_hidden, cfg.adapter_dropout, cfg.adapter_out_std))
        # Output of the frozen layers below the lowest adapter, by input: the worker runs
        # each micro-batch's forward twice (send, then recompute at apply time), and this
        # part needs no autograd and never changes.
        self._frozen_cache: collections.OrderedDict[bytes, paddle.Tensor] = collections.OrderedDict()

    def forward(self, src_ids: np.ndarray, src_mask: np.ndarray) -> paddle.Tensor:
        """src_ids [B, S] in the tokenizer's (unpruned) id space, src_mask [B, S] 1/0 -> enc_out [B, S, H]."""
        ids = np.asarray(src_ids, dtype=np.int64)
        if self.vocab is not None:
            ids = self.vocab.old_to_new(ids)
        mask = np.asarray(src_mask, dtype=np.float32)
        bias = padding_bias(paddle.to_tensor(mask))
        first = self.cfg.encoder.first_adapted
        x = self._frozen_part(ids, mask, bias, first)  # [B, S, H], no autograd
        return self.stack.run_layers(x, bias, start=first)

    def _frozen_part(self, ids: np.ndarray, mask: np.ndarray, bias: paddle.Tensor, first: int) -> paddle.Tensor:
        """Embeddings and layers ``< first`` (all frozen), remembered for the last few inputs."""
        key = ids.shape[1].to_bytes(4, "little") + ids.tobytes() + mask.tobytes()
        hit = self._frozen_cache.get(key)
        if hit is not None:
            self._frozen_cache.move_to_end(key)
            return hit
        with paddle.no_grad():
            x = self.stack.run_layers(self.stack.embeddings(paddle.to_tensor(ids)), bias, stop=first)
        self._frozen_cache[key] = x
        while len(self._frozen_cache) > FROZEN_CACHE_ENTRIES:
            self._frozen_cache.popitem(last=False)
        return x

    def backward(self, enc_out: paddle.Tensor, grad: np.ndarray) -> None:
        """Back-propagate the gradient received from cluster T into the adapters."""
        if tuple(grad.shape) != tuple(enc_out.shape):
            raise ShapeMismatch(f"gradient shape {tuple(grad.shape)} != activation shape {tuple(enc_out.shape)}")
        enc_out.backward(paddle.to_tensor(np.asarray(grad, dtype=np.float32)))


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

    def features(self, h: paddle.Tensor) -> paddle.Tensor:
        return self.ln(F.gelu(self.transform(h)))  # [B, T, H]

    def logits(self, z: paddle.Tensor) -> paddle.Tensor:
        return paddle.matmul(z, self._tied[0], transpose_y=True) + self.bias  # [B, T, V]

    def forward(self, h: paddle.Tensor) -> paddle.Tensor:
        return self.logits(self.features(h))

    def token_logits(self, z: paddle.Tensor, labels: paddle.Tensor) -> paddle.Tensor:
        """The logit of each label, [B, T], from the features alone: O(H) per token, not O(V)."""
        rows = F.embedding(labels, self._tied[0])  # [B, T, H]
        return (z * rows).sum(axis=-1) + paddle.gather(self.bias, labels.flatten()).reshape(labels.shape)

    def mean_logits(self, z: paddle.Tensor) -> paddle.Tensor:
        """The mean logit over the vocabulary, [B, T]: z . mean(W) + mean(b)."""
        w_mean = self._tied[0].mean(axis=0)  # [H]; the tied matrix is frozen, so no gradient
        return paddle.matmul(z, w_mean.unsqueeze(-1)).squeeze(-1) + self.bias.mean()


def smoothed_cross_entropy(head: LMHead, z: paddle.Tensor, labels: paddle.Tensor, eps: float) -> paddle.Tensor:
    """Per-token (1 - eps) * NLL + eps * mean_v(-log p_v), [B, T].

    paddle's fused ``cross_entropy`` gives the NLL fast; its label smoothing needs
    float labels, and the obvious log-softmax route (logsumexp, then
    ``take_along_axis``) is 10x slower on CPU, mostly in the scatter that
    ``take_along_axis`` does in backward. The smoothing term needs no [B, T, V]
    tensor besides the logits: -mean_v log p_v = logsumexp - mean_v(logit_v), and
    logsumexp = NLL + logit_label, both label and mean logits computed from the
    features (see :meth:`LMHead.token_logits`, :meth:`LMHead.mean_logits`).
    """
    logits = head.logits(z)  # [B, T, V]
    nll = F.cross_entropy(logits, labels.unsqueeze(-1), reduction="none").squeeze(-1)  # [B, T]
    if not eps:
        return nll
    smooth = nll + head.token_logits(z, labels) - head.mean_logits(z)
    return (1.0 - eps) * nll + eps * smooth


class DecoderSide(_Trained):
    """Cluster T. Targets are [B, T] = BOS, tokens, EOS, then padding, in the tokenizer's ids.

    ``tgt_keep_ids``: the target tokens of the training corpus. The word embeddings,
    and so the output layer tied to them, keep only those rows (plus the special
    tokens): a decoder cannot learn to produce a token it never saw, and the output
    layer's cost is proportional to its rows. Inputs are mapped into the kept rows
    and outputs back, so callers always speak the tokenizer's ids.
    """

    def __init__(self, cfg: ABNetConfig, tgt_keep_ids: np.ndarray | list[int] | None = None) -> None:
        super().__init__()
        paddle.seed(cfg.seed + 1)
        self.cfg = cfg
        keep = None if tgt_keep_ids is None else np.asarray(tgt_keep_ids, dtype=np.int64)
        self.stack, self.vocab = _load_stack("decoder", cfg.decoder, keep)
        d, e = cfg.decoder, cfg.encoder
        _insert(self.stack, d, lambda: CrossAttentionAdapter(
            d.hidden, e.hidden, d.heads, cfg.adapter_hidden, cfg.adapter_dropout, cfg.adapter_out_std))
        self.head = LMHead(self.stack.embeddings.word.weight, d.hidden)
        self.pad_id, self.bos_id, self.eos_id = (int(i) for i in self.to_model(
            np.array([cfg.tgt_pad_id, cfg.tgt_bos_id, cfg.tgt_eos_id])))

    def to_model(self, ids: np.ndarray) -> np.ndarray:
        """Tokenizer ids -> rows of the (possibly pruned) vocabulary, int64."""
        ids = np.asarray(ids, dtype=np.int64)
        return ids if self.vocab is None else self.vocab.old_to_new(ids)

    def to_tokenizer(self, rows: list[list[int]]) -> list[list[int]]:
        """Rows of the vocabulary -> tokenizer ids (decoder outputs)."""
        if self.vocab is None:
            return rows
        kept = self.vocab.kept_ids
        return [[int(kept[r]) for r in row] for row in rows]

    def hidden(self, enc_out: paddle.Tensor, enc_mask: paddle.Tensor, tgt_in: paddle.Tensor) -> paddle.Tensor:
        """enc_out [B, S, He], enc_mask [B, S], tgt_in [B, T] (vocabulary rows) -> [B, T, H]."""
        memory = Memory(enc_out, padding_bias(enc_mask))
        tgt_mask = paddle.cast(tgt_in != self.pad_id, "float32")
        return self.stack(tgt_in, causal_bias(tgt_mask), memory)

    def logits(self, enc_out: paddle.Tensor, enc_mask: paddle.Tensor, tgt_in: paddle.Tensor) -> paddle.Tensor:
        """As :meth:`hidden`, then the LM head -> logits [B, T, V]."""
        return self.head(self.hidden(enc_out, enc_mask, tgt_in))

    def loss(self, enc_out: paddle.Tensor, enc_mask: np.ndarray, tgt_ids: np.ndarray) -> paddle.Tensor:
        """Mean token cross entropy (label smoothing per config) over non-pad target tokens."""
        tgt = self.to_model(tgt_ids)
        if tgt.ndim != 2 or tgt.shape[1] < 2 or tgt.shape[0] != enc_out.shape[0]:
            raise ShapeMismatch(f"targets must be [B={enc_out.shape[0]}, T>=2], got {tgt.shape}")
        mask = paddle.to_tensor(np.asarray(enc_mask, dtype=np.float32))
        z = self.head.features(self.hidden(enc_out, mask, paddle.to_tensor(tgt[:, :-1])))  # [B, T-1, H]
        per_token = smoothed_cross_entropy(self.head, z, paddle.to_tensor(tgt[:, 1:]), self.cfg.label_smoothing)
        keep = paddle.to_tensor((tgt[:, 1:] != self.pad_id).astype(np.float32))
        return (per_token * keep).sum() / paddle.clip(keep.sum(), min=1.0)

    def loss_and_grad(self, enc_out_np: np.ndarray, enc_mask_np: np.ndarray,
                      tgt_ids_np: np.ndarray) -> tuple[float, np.ndarray]:
        """Loss on a received activation; backward into the adapters; d loss / d enc_out."""
        enc_out = paddle.to_tensor(np.asarray(enc_out_np, dtype=np.float32), stop_gradient=False)
        loss = self.loss(enc_out, enc_mask_np, tgt_ids_np)
        loss.backward()
        assert enc_out.grad is not None  # enc_out requires a gradient and the loss depends on it
        return float(loss), enc_out.grad.numpy()

    def next_token_scorer(self, enc_out_np: np.ndarray, enc_mask_np: np.ndarray, cached: bool = True) -> StepFn:
        """A no-grad ``step(prefix, rows, parents) -> log-probs [N, V]`` for the search functions
        (:mod:`nebula_mq.models.beam_search`); ``cached=False`` re-runs whole prefixes."""
        return (CachedScorer if cached else PrefixScorer)(self, enc_out_np, enc_mask_np)

    def decode(self, enc_out_np: np.ndarray, enc_mask_np: np.ndarray, beam: int = 4,
               max_len: int = 64, alpha: float = 1.0) -> list[list[int]]:
        """Translate from a received activation; beam=1 is greedy. Outputs exclude BOS/EOS."""
        was_training = self.training
        self.eval()
        step, batch = self.next_token_scorer(enc_out_np, enc_mask_np), len(enc_out_np)
        try:
            if beam == 1:
                rows = greedy_search(step, batch, self.bos_id, self.eos_id, max_len)
            else:
                rows = beam_search(step, batch, self.bos_id, self.eos_id, max_len, beam, alpha)
        finally:
            self.train(was_training)
        return self.to_tokenizer(rows)


class ABNet(_Trained):
    """Both sides in one process: joint loss (the reference for the split) and translation."""

    def __init__(self, cfg: ABNetConfig, src_keep_ids: np.ndarray | list[int] | None = None,
                 tgt_keep_ids: np.ndarray | list[int] | None = None) -> None:
        super().__init__()
        self.encoder = EncoderSide(cfg, src_keep_ids)
        self.decoder = DecoderSide(cfg, tgt_keep_ids)

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


def _log_softmax(logits: paddle.Tensor) -> np.ndarray:
    """[N, V] -> log-probabilities as numpy. (paddle 3.3's CPU ``F.log_softmax`` is
    pathologically slow on wide rows; x - logsumexp(x) agrees to 2e-6.)"""
    return (logits - paddle.logsumexp(logits, axis=-1, keepdim=True)).numpy()


class _Scorer:
    def __init__(self, side: DecoderSide, enc_out: np.ndarray, enc_mask: np.ndarray) -> None:
        self.side = side
        self.enc = paddle.to_tensor(np.asarray(enc_out, dtype=np.float32))  # [B, S, He]
        self.mask = paddle.to_tensor(np.asarray(enc_mask, dtype=np.float32))  # [B, S]
        self.never = [side.bos_id, side.pad_id]  # never generated

    def _finish(self, h_last: paddle.Tensor) -> np.ndarray:
        logp = _log_softmax(self.side.head(h_last))  # [N, V]
        logp[:, self.never] = -np.inf
        return logp


class PrefixScorer(_Scorer):
    """Re-runs each prefix whole (no cache): the reference for :class:`CachedScorer`."""

    def __call__(self, prefix: np.ndarray, rows: np.ndarray, parents: np.ndarray | None = None) -> np.ndarray:
        idx = paddle.to_tensor(rows)
        with paddle.no_grad():
            h = self.side.hidden(paddle.gather(self.enc, idx), paddle.gather(self.mask, idx),
                                 paddle.to_tensor(prefix))  # [N, t, H]
            return self._finish(h[:, -1])


class CachedScorer(_Scorer):
    """Scores only the newest token of each prefix; see the module docstring."""

    def __init__(self, side: DecoderSide, enc_out: np.ndarray, enc_mask: np.ndarray) -> None:
        super().__init__(side, enc_out, enc_mask)
        self.pasts: list[LayerPast] = []
        self.memory: Memory | None = None

    def __call__(self, prefix: np.ndarray, rows: np.ndarray, parents: np.ndarray | None = None) -> np.ndarray:
        t = prefix.shape[1] - 1  # position of the newest token
        with paddle.no_grad():
            if parents is None or t == 0:  # a new search: memory for these rows, empty caches
                idx = paddle.to_tensor(rows)
                self.memory = Memory(paddle.gather(self.enc, idx), padding_bias(paddle.gather(self.mask, idx)))
                self.pasts = [LayerPast() for _ in self.side.stack.layers]
            else:
                order = paddle.to_tensor(np.asarray(parents, dtype=np.int64))
                for past in self.pasts:
                    past.reorder(order)
            stack = self.side.stack
            x = stack.embeddings(paddle.to_tensor(prefix[:, -1:]), start=t)  # [N, 1, H]
            h = stack.run_layers(x, None, self.memory, pasts=self.pasts)  # [N, 1, H]
            return self._finish(h[:, 0])
