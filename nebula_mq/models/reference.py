"""A direct numpy forward pass of post-LN BERT, used as the test oracle for the paddle port.

MiniLM's own package needs torch (sentence-transformers) for inference, which
we do not install; this is the BERT definition written out in numpy, in
float64, reading the same :mod:`pretrained` dicts (Linear weights [in, out]).
It handles one unpadded sequence at a time: no masks, nothing shared with
the paddle code.
"""

from __future__ import annotations

import math

import numpy as np

from nebula_mq.models.pretrained import PretrainedWeights

_erf = np.vectorize(math.erf)


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def bert_states(weights: PretrainedWeights, ids: list[int]) -> np.ndarray:
    """Token states [T, H] of one sequence."""
    t = {k: v.astype(np.float64) for k, v in weights.tensors.items()}
    s = weights.shape
    n, hd = len(ids), s.hidden // s.heads
    x = t["embeddings.word"][ids] + t["embeddings.position"][:n] + t["embeddings.token_type"][0]
    x = _ln(x, t["embeddings.ln.weight"], t["embeddings.ln.bias"], s.layer_norm_eps)
    for i in range(s.layers):
        p = f"layers.{i}."
        q, k, v = (x @ t[p + f"attention.{m}.weight"] + t[p + f"attention.{m}.bias"] for m in ("query", "key", "value"))
        ctx = np.empty_like(x)
        for h in range(s.heads):
            sl = slice(h * hd, (h + 1) * hd)
            a = q[:, sl] @ k[:, sl].T / math.sqrt(hd)
            a = np.exp(a - a.max(-1, keepdims=True))
            ctx[:, sl] = (a / a.sum(-1, keepdims=True)) @ v[:, sl]
        att = ctx @ t[p + "attention.output.weight"] + t[p + "attention.output.bias"]
        x = _ln(x + att, t[p + "attention.ln.weight"], t[p + "attention.ln.bias"], s.layer_norm_eps)
        mid = x @ t[p + "ffn.inner.weight"] + t[p + "ffn.inner.bias"]
        mid = 0.5 * mid * (1.0 + _erf(mid / math.sqrt(2.0)))
        out = mid @ t[p + "ffn.outer.weight"] + t[p + "ffn.outer.bias"]
        x = _ln(x + out, t[p + "ffn.ln.weight"], t[p + "ffn.ln.bias"], s.layer_norm_eps)
    return x


def sentence_embedding(weights: PretrainedWeights, ids: list[int]) -> np.ndarray:
    """Mean-pooled, L2-normalised sentence embedding [H] (sentence-transformers recipe)."""
    v = bert_states(weights, ids).mean(0)
    return v / np.linalg.norm(v)
