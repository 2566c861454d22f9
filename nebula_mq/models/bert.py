"""A small post-LN BERT in paddle, with adapter slots after each sub-layer.

Parameter names match :mod:`nebula_mq.models.pretrained` (``embeddings.word``,
``layers.3.attention.query.weight``...), so a numpy dict loads 1:1 with
:func:`load_numpy_state`. Linear weights are [in, out] (paddle layout).

Adapters (ABNet) are *composed into* a layer rather than copy-pasted into a
new layer class: every :class:`BertLayer` has two optional slots,
``after_attention`` and ``after_ffn``, each an :class:`Adapter` that maps the
sub-layer output ``h`` (and, for decoder adapters, the encoder memory) to a
new ``h`` of the same shape.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from nebula_mq.errors import DataError
from nebula_mq.models.pretrained import TransformerShape

NEG_INF = -1e9  # additive attention bias of a masked key (finite: no NaN on all-masked rows)


# What a BertEncoder is built to: the pretrained files' shape, or a random stack's.
BertConfig = TransformerShape


@dataclass(frozen=True)
class Memory:
    """What a decoder adapter attends to: the encoder output and its key bias.

    Each cross-attention projects the memory to keys and values once per Memory
    (:meth:`keys_values`): once per forward pass in training, once per sentence
    when decoding token by token.
    """

    states: paddle.Tensor  # [B, S, H_enc]
    bias: paddle.Tensor  # [B, 1, 1, S] additive, 0 for real tokens, NEG_INF for padding
    _projected: dict[int, tuple[paddle.Tensor, paddle.Tensor]] = field(default_factory=dict, compare=False, repr=False)

    def keys_values(self, attention: MultiHeadAttention) -> tuple[paddle.Tensor, paddle.Tensor]:
        """``attention``'s keys and values of the memory [B, nh, S, hd], computed on first use."""
        kv = self._projected.get(id(attention))
        if kv is None:
            kv = self._projected[id(attention)] = attention.keys_values(self.states)
        return kv


class LayerPast:
    """Self-attention keys and values of the positions a decoder has already seen (one layer).

    With a causal mask a new token changes nothing before it, so decoding one token
    at a time against these is exact, and costs O(t) per token instead of O(t^2)."""

    def __init__(self) -> None:
        self.k: paddle.Tensor | None = None  # [N, nh, t, hd]
        self.v: paddle.Tensor | None = None

    def extend(self, k: paddle.Tensor, v: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        if self.k is None or self.v is None:
            self.k, self.v = k, v
        else:
            self.k, self.v = paddle.concat([self.k, k], axis=2), paddle.concat([self.v, v], axis=2)
        return self.k, self.v

    def reorder(self, index: paddle.Tensor) -> None:
        """Row i now continues row ``index[i]`` (beam search)."""
        if self.k is not None and self.v is not None:
            self.k, self.v = paddle.gather(self.k, index), paddle.gather(self.v, index)


def padding_bias(mask: paddle.Tensor) -> paddle.Tensor:
    """[B, T] 1/0 mask -> additive key bias [B, 1, 1, T]."""
    m = paddle.cast(mask, "float32")
    return ((1.0 - m) * NEG_INF).unsqueeze([1, 2])


def causal_bias(mask: paddle.Tensor) -> paddle.Tensor:
    """[B, T] 1/0 mask -> additive bias [B, 1, T, T]: no look-ahead, no padding keys."""
    t = mask.shape[1]
    future = paddle.triu(paddle.full([t, t], NEG_INF, dtype="float32"), diagonal=1)  # [T, T]
    return padding_bias(mask) + future.unsqueeze([0, 1])


class Adapter(nn.Layer, abc.ABC):
    """Extension point: a module inserted after a BERT sub-layer."""

    @abc.abstractmethod
    def forward(self, h: paddle.Tensor, memory: Memory | None) -> paddle.Tensor:
        """[B, T, H] -> [B, T, H]."""


class Embeddings(nn.Layer):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(cfg.vocab, cfg.hidden)
        self.position = nn.Embedding(cfg.positions, cfg.hidden)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.ln = nn.LayerNorm(cfg.hidden, epsilon=cfg.layer_norm_eps)

    def forward(self, ids: paddle.Tensor, start: int = 0) -> paddle.Tensor:
        """ids [B, T] at positions start .. start + T - 1 -> [B, T, H]."""
        t = ids.shape[1]
        pos = paddle.arange(start, start + t, dtype="int64").unsqueeze(0)  # [1, T]
        x = self.word(ids) + self.position(pos) + self.token_type(paddle.zeros_like(ids))  # [B, T, H]
        return self.ln(x)


class MultiHeadAttention(nn.Layer):
    """Scaled dot-product attention; keys/values may come from another sequence."""

    def __init__(self, hidden: int, heads: int, kv_hidden: int | None = None) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden {hidden} not divisible by heads {heads}")
        kv = hidden if kv_hidden is None else kv_hidden
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(kv, hidden)
        self.value = nn.Linear(kv, hidden)
        self.output = nn.Linear(hidden, hidden)

    def _split(self, x: paddle.Tensor) -> paddle.Tensor:
        b, t, _ = x.shape
        return x.reshape([b, t, self.heads, self.head_dim]).transpose([0, 2, 1, 3])  # [B, nh, T, hd]

    def keys_values(self, context: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """context [B, Tk, H_kv] -> keys and values [B, nh, Tk, hd] (what a decoding cache keeps)."""
        return self._split(self.key(context)), self._split(self.value(context))

    def attend_kv(self, x: paddle.Tensor, k: paddle.Tensor, v: paddle.Tensor, bias: paddle.Tensor | None) -> paddle.Tensor:
        """Queries from x [B, Tq, H] over given keys/values [B, nh, Tk, hd] -> [B, Tq, H]."""
        q = self._split(self.query(x))  # [B, nh, Tq, hd]
        att = paddle.matmul(q, k, transpose_y=True) / math.sqrt(self.head_dim)  # [B, nh, Tq, Tk]
        if bias is not None:
            att = att + bias
        att = F.softmax(att, axis=-1)
        y = paddle.matmul(att, v).transpose([0, 2, 1, 3])  # [B, Tq, nh, hd]
        b, t = y.shape[0], y.shape[1]
        return self.output(y.reshape([b, t, self.heads * self.head_dim]))  # [B, Tq, H]

    def attend(self, x: paddle.Tensor, context: paddle.Tensor, bias: paddle.Tensor) -> paddle.Tensor:
        return self.attend_kv(x, *self.keys_values(context), bias)


class AttentionSubLayer(MultiHeadAttention):
    """BERT self-attention sub-layer: LN(x + attn(x))."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__(cfg.hidden, cfg.heads)
        self.ln = nn.LayerNorm(cfg.hidden, epsilon=cfg.layer_norm_eps)

    def forward(self, x: paddle.Tensor, bias: paddle.Tensor | None, past: LayerPast | None = None) -> paddle.Tensor:
        """[B, T, H] -> [B, T, H]; with ``past``, x holds only the new positions."""
        if past is None:
            return self.ln(x + self.attend(x, x, bias))  # type: ignore[arg-type]
        return self.ln(x + self.attend_kv(x, *past.extend(*self.keys_values(x)), bias))


class FeedForwardSubLayer(nn.Layer):
    """BERT FFN sub-layer: LN(x + W2 gelu(W1 x))."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.inner = nn.Linear(cfg.hidden, cfg.ffn)
        self.outer = nn.Linear(cfg.ffn, cfg.hidden)
        self.ln = nn.LayerNorm(cfg.hidden, epsilon=cfg.layer_norm_eps)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.ln(x + self.outer(F.gelu(self.inner(x))))  # [B, T, H]


class BertLayer(nn.Layer):
    def __init__(self, cfg: BertConfig, after_attention: Adapter | None = None,
                 after_ffn: Adapter | None = None) -> None:
        super().__init__()
        self.attention = AttentionSubLayer(cfg)
        self.ffn = FeedForwardSubLayer(cfg)
        # Registered only when present, so plain BERT keeps the pretrained names.
        self.after_attention = after_attention
        self.after_ffn = after_ffn

    def forward(self, x: paddle.Tensor, bias: paddle.Tensor | None, memory: Memory | None = None,
                past: LayerPast | None = None) -> paddle.Tensor:
        h = self.attention(x, bias, past)  # [B, T, H]
        if self.after_attention is not None:
            h = self.after_attention(h, memory)
        h = self.ffn(h)
        if self.after_ffn is not None:
            h = self.after_ffn(h, memory)
        return h  # [B, T, H]


class BertEncoder(nn.Layer):
    """Embeddings + a stack of post-LN layers; returns all token states."""

    def __init__(self, cfg: BertConfig, layers: list[BertLayer] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.LayerList(layers if layers is not None else [BertLayer(cfg) for _ in range(cfg.layers)])

    def forward(self, ids: paddle.Tensor, bias: paddle.Tensor, memory: Memory | None = None) -> paddle.Tensor:
        return self.run_layers(self.embeddings(ids), bias, memory)  # [B, T, H]

    def run_layers(self, x: paddle.Tensor, bias: paddle.Tensor | None, memory: Memory | None = None,
                   start: int = 0, stop: int | None = None, pasts: list[LayerPast] | None = None) -> paddle.Tensor:
        """Layers ``start .. stop - 1`` on hidden states x [B, T, H] (``pasts``: one per layer run)."""
        for i, layer in enumerate(list(self.layers)[start:stop]):
            x = layer(x, bias, memory, None if pasts is None else pasts[i])
        return x


def mean_pool(states: paddle.Tensor, mask: paddle.Tensor, normalize: bool = True) -> paddle.Tensor:
    """Masked mean over tokens [B, T, H] -> [B, H], L2-normalised (e5 / sentence-transformers)."""
    m = paddle.cast(mask, states.dtype).unsqueeze(-1)  # [B, T, 1]
    pooled = (states * m).sum(axis=1) / paddle.clip(m.sum(axis=1), min=1.0)
    return F.normalize(pooled, axis=-1) if normalize else pooled


def load_numpy_state(layer: nn.Layer, tensors: dict[str, np.ndarray], prefix: str = "") -> None:
    """Copy a :mod:`pretrained` dict into ``layer`` (names under ``prefix``), checking every shape.

    Pretrained tensors the layer lacks (e.g. layers beyond a truncated stack)
    are an error; layer parameters the dict lacks (adapters) are left alone.
    """
    params = dict(layer.named_parameters())
    for name, value in tensors.items():
        key = prefix + (name if name.endswith((".weight", ".bias")) else name + ".weight")
        p = params.get(key)
        if p is None:
            raise DataError(f"pretrained tensor {name!r} has no parameter {key!r} in {type(layer).__name__}")
        if tuple(p.shape) != value.shape:
            raise DataError(f"pretrained tensor {name!r}: shape {value.shape}, parameter {key!r} is {tuple(p.shape)}")
        p.set_value(value.astype(np.float32, copy=False))


def freeze(layer: nn.Layer) -> None:
    """Exclude every parameter of ``layer`` from training."""
    for p in layer.parameters():
        p.stop_gradient = True
        p.trainable = False
