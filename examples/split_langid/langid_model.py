"""A small byte-level transformer in PyTorch, cut in two, that tells the language of a
gettext string (langid_data.py).

The head (cluster S, which holds the strings) embeds bytes and positions and runs one
encoder layer; it sends the activation [B, L, d]. The tail (cluster T, which holds the
labels) runs another encoder layer, mean-pools over the positions and classifies.

    nebula-mq run examples/split_langid/job.toml
    python examples/split_langid/evaluate.py examples/split_langid/job.toml
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from langid_data import BATCH, MAX_BYTES, PAD, LangData, batch_ids, dataset
from workers.split import HeadSpec, TailSpec

WIDTH, HEADS, FFN = 64, 4, 128  # d, attention heads, feed-forward width


def encoder_layer(dropout: float) -> nn.TransformerEncoderLayer:
    """One pre-norm encoder layer of the example's width."""
    return nn.TransformerEncoderLayer(WIDTH, HEADS, FFN, dropout=dropout, batch_first=True, norm_first=True)


class ByteHead(nn.Module):  # type: ignore[misc]
    """Bytes [B, L] (int64, 0 = padding) -> contextual vectors [B, L, d]."""

    def __init__(self, dropout: float = 0.1, max_bytes: int = MAX_BYTES) -> None:
        super().__init__()
        self.embed = nn.Embedding(257, WIDTH, padding_idx=PAD)
        self.position = nn.Embedding(max_bytes, WIDTH)
        self.layer = encoder_layer(dropout)

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        h = self.embed(data) + self.position(torch.arange(data.shape[1], device=data.device))
        return self.layer(h, src_key_padding_mask=data == PAD)


class ByteTail(nn.Module):  # type: ignore[misc]
    """Vectors [B, L, d] -> logits [B, K]: an encoder layer, the mean over positions, a classifier."""

    def __init__(self, languages: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.layer = encoder_layer(dropout)
        self.norm = nn.LayerNorm(WIDTH)
        self.classify = nn.Linear(WIDTH, languages)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.classify(self.norm(self.layer(h).mean(dim=1)))


def head_model(seed: int = 0, dropout: float = 0.1) -> ByteHead:
    torch.manual_seed(seed)
    return ByteHead(dropout)


def tail_model(languages: int, seed: int = 1, dropout: float = 0.1) -> ByteTail:
    torch.manual_seed(seed)
    return ByteTail(languages, dropout)


# ---- builders named in job.toml, for `nebula-mq run` ----------------------------------------

def build_head(settings: Any, data: LangData | None = None, batch: int = BATCH) -> HeadSpec:
    """Cluster S: the strings' bytes; micro-batch ``mb`` is ``batch_ids(mb)`` of the training split."""
    x = (data or dataset()).train_bytes
    return HeadSpec(model=head_model(), inputs=lambda mb: (ids := batch_ids(mb, len(x), batch), x[ids]))


def build_tail(settings: Any, data: LangData | None = None) -> TailSpec:
    """Cluster T: the strings' languages, and the cross-entropy of the logits."""
    data = data or dataset()
    y = data.train_labels
    return TailSpec(model=tail_model(len(data.languages)), loss=nn.functional.cross_entropy,
                    targets=lambda ids: y[ids], baseline=math.log(len(data.languages)))  # chance
