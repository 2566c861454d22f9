"""ABNet adapters (paper §3.2): the only trainable parts of the two pretrained stacks.

Both are :class:`~nebula_mq.models.bert.Adapter` s, dropped into the slots of
a frozen :class:`~nebula_mq.models.bert.BertLayer`. Their last projection is
initialised with a small std (``out_std``) so that, at step 0, each adapter is
close to the identity and the pretrained model's behaviour is preserved.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn

from nebula_mq.models.bert import Adapter, Memory, MultiHeadAttention


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
