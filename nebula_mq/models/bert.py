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
from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from nebula_mq.errors import DataError
from nebula_mq.models.pretrained import TransformerShape

NEG_INF = -1e9  # additive attention bias of a masked key (finite: no NaN on all-masked rows)


@dataclass(frozen=True)
class BertConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    ffn: int
    positions: int = 512
    type_vocab: int = 2
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_shape(cls, s: TransformerShape) -> BertConfig:
        return cls(s.vocab, s.hidden, s.layers, s.heads, s.ffn, s.positions, s.type_vocab, s.layer_norm_eps)


@dataclass(frozen=True)
class Memory:
    """What a decoder adapter attends to: the encoder output and its key bias."""

    states: paddle.Tensor  # [B, S, H_enc]
    bias: paddle.Tensor  # [B, 1, 1, S] additive, 0 for real tokens, NEG_INF for padding


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

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        t = ids.shape[1]
        pos = paddle.arange(t, dtype="int64").unsqueeze(0)  # [1, T]
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

    def attend(self, x: paddle.Tensor, context: paddle.Tensor, bias: paddle.Tensor) -> paddle.Tensor:
        q = self._split(self.query(x))  # [B, nh, Tq, hd]
        k = self._split(self.key(context))  # [B, nh, Tk, hd]
        v = self._split(self.value(context))  # [B, nh, Tk, hd]
        att = paddle.matmul(q, k, transpose_y=True) / math.sqrt(self.head_dim) + bias  # [B, nh, Tq, Tk]
        att = F.softmax(att, axis=-1)
        y = paddle.matmul(att, v).transpose([0, 2, 1, 3])  # [B, Tq, nh, hd]
        b, t = y.shape[0], y.shape[1]
        return self.output(y.reshape([b, t, self.heads * self.head_dim]))  # [B, Tq, H]


class AttentionSubLayer(MultiHeadAttention):
    """BERT self-attention sub-layer: LN(x + attn(x))."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__(cfg.hidden, cfg.heads)
        self.ln = nn.LayerNorm(cfg.hidden, epsilon=cfg.layer_norm_eps)

    def forward(self, x: paddle.Tensor, bias: paddle.Tensor) -> paddle.Tensor:
        return self.ln(x + self.attend(x, x, bias))  # [B, T, H]


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

    def forward(self, x: paddle.Tensor, bias: paddle.Tensor, memory: Memory | None = None) -> paddle.Tensor:
        h = self.attention(x, bias)  # [B, T, H]
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
        x = self.embeddings(ids)  # [B, T, H]
        for layer in self.layers:
            x = layer(x, bias, memory)
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
