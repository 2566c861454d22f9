"""Greedy and beam search over a next-token scorer (numpy; the model supplies ``step``).

``step(prefix, rows, parents)`` gets the decoder input so far, ``prefix`` [N, t]
(int64, starting with BOS), ``rows`` [N], the source sentence each prefix
belongs to, and ``parents`` [N]: which prefix of the previous call each one
extends (None on the first call, when every prefix is BOS alone). It returns
next-token log-probabilities [N, V]. ``parents`` lets a scorer keep a key/value
cache and score only the newest token (beams reorder the cache); a scorer may
also ignore it and re-run the prefixes whole.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class StepFn(Protocol):
    def __call__(self, prefix: np.ndarray, rows: np.ndarray, parents: np.ndarray | None = None) -> np.ndarray: ...


def greedy_search(step: StepFn, batch: int, bos: int, eos: int, max_len: int) -> list[list[int]]:
    """Argmax decoding; returned sequences exclude BOS and EOS."""
    prefix = np.full((batch, 1), bos, dtype=np.int64)
    done = np.zeros(batch, dtype=bool)
    out: list[list[int]] = [[] for _ in range(batch)]
    rows = np.arange(batch)
    for t in range(max_len):
        nxt = step(prefix, rows, None if t == 0 else rows).argmax(-1)  # [B]; each prefix extends itself
        for b in np.nonzero(~done)[0]:
            if nxt[b] == eos:
                done[b] = True
            else:
                out[b].append(int(nxt[b]))
        if done.all():
            break
        prefix = np.concatenate([prefix, nxt[:, None]], axis=1)
    return out


def beam_search(step: StepFn, batch: int, bos: int, eos: int, max_len: int,
                beam: int = 4, alpha: float = 1.0) -> list[list[int]]:
    """Batched beam search with length normalisation score / len**alpha.

    A sentence stops once it has ``beam`` finished hypotheses; at ``max_len``
    its live beams count as finished. Returned sequences exclude BOS and EOS.
    """
    if beam < 1 or max_len < 1:
        raise ValueError(f"beam and max_len must be >= 1, got {beam}, {max_len}")
    k = beam
    prefix = np.full((batch * k, 1), bos, dtype=np.int64)  # [B*K, t]
    scores = np.full((batch, k), -np.inf)
    scores[:, 0] = 0.0  # one live beam per sentence at the start
    rows = np.repeat(np.arange(batch), k)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = np.zeros(batch, dtype=bool)
    parents: np.ndarray | None = None
    for t in range(1, max_len + 1):
        logp = step(prefix, rows, parents).astype(np.float64)  # [B*K, V]
        vocab = logp.shape[1]
        cand = (scores.reshape(-1, 1) + logp).reshape(batch, k * vocab)  # [B, K*V]
        order = _best(cand, 2 * k)  # best 2K: K survive even if K end
        new_prefix = prefix.reshape(batch, k, -1).copy()
        new_parent = np.arange(batch * k).reshape(batch, k)  # a row that is not replaced extends itself
        new_tok = np.full((batch, k), eos, dtype=np.int64)
        new_scores = np.full((batch, k), -np.inf)
        for b in np.nonzero(~done)[0]:
            live = 0
            for c in order[b]:
                score = cand[b, c]
                if not np.isfinite(score) or live == k:
                    break
                src, tok = divmod(int(c), vocab)
                if tok == eos:
                    finished[b].append((score / t**alpha, prefix[b * k + src, 1:].tolist()))
                    continue
                new_prefix[b, live], new_tok[b, live], new_scores[b, live] = prefix[b * k + src], tok, score
                new_parent[b, live] = b * k + src
                live += 1
            if len(finished[b]) >= k or t == max_len:
                done[b] = True
                if t == max_len:
                    finished[b] += [(new_scores[b, j] / t**alpha, new_prefix[b, j, 1:].tolist() + [int(new_tok[b, j])])
                                    for j in range(live)]
        if done.all():
            break
        prefix = np.concatenate([new_prefix.reshape(batch * k, -1), new_tok.reshape(-1, 1)], axis=1)
        parents = new_parent.reshape(-1)
        scores = new_scores
    return [max(f, key=lambda sf: sf[0])[1] if f else [] for f in finished]


def _best(cand: np.ndarray, n: int) -> np.ndarray:
    """Column indices of the ``n`` largest entries of each row, best first (ties: lower index first,
    as a stable sort of the whole row would give)."""
    n = min(n, cand.shape[1])
    top = np.argpartition(-cand, n - 1, axis=1)[:, :n]  # [B, n], unordered
    vals = np.take_along_axis(cand, top, axis=1)
    order = np.lexsort((top, -vals), axis=1)  # by value descending, then index ascending
    return np.take_along_axis(top, order, axis=1)
