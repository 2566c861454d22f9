"""Stateful compression around the stateless codecs: delta compression and error feedback.

Both keep one float32 block per *sample id* (``[length_i, H]``: the sample's
real tokens; padding is never stored), because an activation or a gradient
row only means something for the sample it belongs to, and a sample comes
back once per epoch.

* :class:`DeltaCompression` (AQ-SGD, Wang et al. 2022): instead of the
  activation ``x`` of a sample, send ``codec(x - ref)`` where ``ref`` is the
  reconstruction both sides made of the same sample last epoch (zero for a
  sample never seen). Both sides then set ``ref <- ref + decode(...)``: the
  sender from its own encoding, the receiver from the bytes it got, which are
  the same bytes, so the two caches stay bit-identical and the quantisation
  error of one epoch is corrected by the next (error feedback built in). As
  training converges the deltas shrink and so does the absolute error of a
  per-row-scaled codec such as ``int8``.
* :class:`ErrorFeedback` (EF-SGD, Seide et al. 2014; Karimireddy et al. 2019)
  for the gradient sent back: send ``codec(g + e)`` and keep
  ``e <- (g + e) - decode(codec(g + e))``. The residual is keyed by sample id
  too: d loss / d enc_out is a per-token quantity of one sample, so a running
  residual shared by all samples would add one sentence's error to another
  sentence's tokens. The next time that sample's activation goes forward its
  gradient carries the residual back into the encoder's adapters.

The caches are part of each side's checkpoint (:meth:`SampleRows.export` /
:meth:`SampleRows.restore`), so a resumed worker continues bit-identically.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from nebula_mq.codecs.base import Codec
from nebula_mq.codecs.decoding import decode_tree
from nebula_mq.errors import ShapeMismatch


def roundtrip(x: np.ndarray, codec: Codec) -> np.ndarray:
    """What the receiver will decode from ``codec.encode(x)`` (codecs are deterministic)."""
    return decode_tree(codec.encode(x))


def _check(ids: np.ndarray, lengths: np.ndarray, x: np.ndarray) -> None:
    if x.ndim != 3 or len(ids) != x.shape[0] or len(lengths) != x.shape[0]:
        raise ShapeMismatch(f"expected [B, T, H] with B = {len(ids)} ids and lengths, got {x.shape}")
    if len(lengths) and (lengths.min() < 0 or lengths.max() > x.shape[1]):
        raise ShapeMismatch(f"lengths must be in 0..{x.shape[1]}, got {lengths.min()}..{lengths.max()}")


class SampleRows:
    """Float32 ``[length, H]`` blocks keyed by sample id."""

    def __init__(self) -> None:
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def gather(self, ids: np.ndarray, lengths: np.ndarray, width: int, hidden: int) -> np.ndarray:
        """``[B, width, hidden]``: each sample's block, zero where unknown or beyond its length."""
        out = np.zeros((len(ids), width, hidden), np.float32)
        for b, (sid, n) in enumerate(zip(ids.tolist(), lengths.tolist())):
            block = self._rows.get(sid)
            if block is None:
                continue
            if block.shape != (n, hidden):
                raise ShapeMismatch(f"sample {sid}: cached {block.shape}, now ({n}, {hidden})")
            out[b, :n] = block
        return out

    def scatter(self, ids: np.ndarray, lengths: np.ndarray, x: np.ndarray) -> None:
        """Store each sample's first ``length`` rows of ``x`` [B, T, H] (a copy)."""
        _check(ids, lengths, x)
        for b, (sid, n) in enumerate(zip(ids.tolist(), lengths.tolist())):
            self._rows[sid] = np.array(x[b, :n], np.float32)

    def export(self, prefix: str) -> dict[str, np.ndarray]:
        """Checkpoint arrays, in sample-id order (so equal caches give equal digests)."""
        ids = np.array(sorted(self._rows), np.int64)
        blocks = [self._rows[int(i)] for i in ids]
        hidden = blocks[0].shape[1] if blocks else 0
        return {
            f"{prefix}/ids": ids,
            f"{prefix}/lengths": np.array([len(b) for b in blocks], np.int64),
            f"{prefix}/rows": np.concatenate(blocks) if blocks else np.zeros((0, hidden), np.float32),
        }

    @classmethod
    def restore(cls, arrays: Mapping[str, np.ndarray], prefix: str) -> SampleRows:
        """Inverse of :meth:`export`; an absent prefix gives an empty cache."""
        out = cls()
        if f"{prefix}/ids" not in arrays:
            return out
        ids, lengths, rows = (arrays[f"{prefix}/{k}"] for k in ("ids", "lengths", "rows"))
        if len(ids) != len(lengths) or int(lengths.sum()) != len(rows):
            raise ShapeMismatch(f"{prefix}: {len(ids)} ids, {int(lengths.sum())} rows expected, {len(rows)} stored")
        ends = np.cumsum(lengths)
        for sid, end, n in zip(ids.tolist(), ends.tolist(), lengths.tolist()):
            out._rows[sid] = np.array(rows[end - n:end], np.float32)
        return out


class DeltaCompression:
    """One side of AQ-SGD delta compression (sender and receiver mirror alike)."""

    def __init__(self, cache: SampleRows | None = None) -> None:
        self.cache = cache if cache is not None else SampleRows()

    def delta(self, ids: np.ndarray, lengths: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Sender: what to encode for the activation ``x`` [B, T, H]."""
        _check(ids, lengths, x)
        return (x - self.cache.gather(ids, lengths, x.shape[1], x.shape[2])).astype(np.float32, copy=False)

    def reconstruct(self, ids: np.ndarray, lengths: np.ndarray, decoded_delta: np.ndarray) -> np.ndarray:
        """Both sides: the activation the receiver sees; updates the cache with it."""
        _check(ids, lengths, decoded_delta)
        ref = self.cache.gather(ids, lengths, decoded_delta.shape[1], decoded_delta.shape[2])
        x_hat = ref + decoded_delta.astype(np.float32, copy=False)
        self.cache.scatter(ids, lengths, x_hat)
        return x_hat


class ErrorFeedback:
    """Residual of a lossy gradient codec, carried to the same sample's next gradient."""

    def __init__(self, residual: SampleRows | None = None) -> None:
        self.residual = residual if residual is not None else SampleRows()

    def with_residual(self, ids: np.ndarray, lengths: np.ndarray, g: np.ndarray) -> np.ndarray:
        """What to encode for the gradient ``g`` [B, T, H]: ``g`` plus each sample's residual."""
        _check(ids, lengths, g)
        return g.astype(np.float32, copy=False) + self.residual.gather(ids, lengths, g.shape[1], g.shape[2])

    def keep_residual(self, ids: np.ndarray, lengths: np.ndarray, g_comp: np.ndarray, sent: np.ndarray) -> None:
        """After encoding ``g_comp``: remember what the codec dropped (``sent`` is its decode)."""
        self.residual.scatter(ids, lengths, g_comp - sent)
