"""Top-k sparsification: keep the ``fraction`` largest-magnitude values.

Ships the kept values (input dtype) and their flat indices (int32, or int64
for tensors of 2**31 elements or more). The rest decode as zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nebula_mq.codecs.base import Codec, EncodeContext, Encoded, check_finite, expect_parts
from nebula_mq.errors import CodecError


def _index_dtype(n: int) -> np.dtype:
    return np.dtype(np.int32 if n < 2**31 else np.int64)


@dataclass(frozen=True)
class TopK(Codec):
    wire_id = 6
    name = "topk"
    fraction: float

    def __post_init__(self) -> None:
        if not (isinstance(self.fraction, float) and 0.0 < self.fraction <= 1.0):
            raise CodecError(f"topk: fraction must be in (0, 1], got {self.fraction!r}")

    def count(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.fraction * n))) if n else 0

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        n = math.prod(shape)
        k = self.count(n)
        return [((k,), dtype), ((k,), _index_dtype(n))]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        # NaN would make the partition order meaningless, Inf is kept as a value.
        check_finite(x, ctx, "topk")
        if ctx.allow_non_finite and np.isnan(x).any():
            raise CodecError("topk: cannot rank NaN values")
        flat = x.reshape(-1)
        k = self.count(flat.size)
        if k == flat.size:
            idx = np.arange(flat.size)
        else:
            idx = np.argpartition(np.abs(flat), flat.size - k)[flat.size - k:]
            idx.sort()  # ascending indices compress better and make decode cache-friendly
        return self._node(x, flat[idx], idx.astype(_index_dtype(flat.size)))

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        n = math.prod(shape)
        k = self.count(n)
        expect_parts("topk", parts, ((k,), dtype.name), ((k,), "i"))
        values, idx = parts
        if k and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise CodecError(f"topk: index out of range 0..{n - 1}")
        out = np.zeros(n, dtype)
        out[idx] = values
        return out.reshape(shape)
