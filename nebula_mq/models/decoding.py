"""Next-token scorers of the ABNet decoder for greedy and beam search.

:class:`CachedScorer` decodes one token at a time against a key/value cache of
the positions already decoded (exact: the decoder is causal). For sentences of
t tokens it costs O(t) decoder passes of one position instead of O(t^2)
positions, and projects the source memory for cross-attention once per
sentence. :class:`PrefixScorer` re-runs every prefix whole; the tests use it
as the reference the cached scorer must agree with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import paddle

from nebula_mq.models.bert import LayerPast, Memory, padding_bias

if TYPE_CHECKING:
    from nebula_mq.models.abnet import DecoderSide


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
