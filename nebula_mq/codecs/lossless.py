"""LZ4 block compression: lossless, bit-exact, for any dtype (token ids, masks, indices)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import lz4.block
import numpy as np

from nebula_mq.codecs.base import Codec, EncodeContext, Encoded, check_finite
from nebula_mq.errors import CodecError, ShapeMismatch


@dataclass(frozen=True)
class LZ4(Codec):
    wire_id = 7
    name = "lz4"

    def accepts(self, dtype: np.dtype) -> bool:
        return True

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        # Data dependent; the raw size is the honest bound (lz4 expands by < 0.4 % + 16 B).
        return [((math.prod(shape) * dtype.itemsize,), np.dtype(np.uint8))]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        check_finite(x, ctx, "lz4")
        packed = lz4.block.compress(x.reshape(-1).view(np.uint8), store_size=False)
        return self._node(x, np.frombuffer(packed, np.uint8))

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if len(parts) != 1 or parts[0].ndim != 1 or parts[0].dtype != np.uint8:
            raise ShapeMismatch("lz4: expected one 1-D uint8 part")
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if n == 0:
            return np.zeros(shape, dtype)
        try:
            raw = lz4.block.decompress(parts[0], uncompressed_size=n)
        except lz4.block.LZ4BlockError as exc:
            raise CodecError(f"lz4: corrupt block: {exc}") from None
        if len(raw) != n:
            raise CodecError(f"lz4: decompressed {len(raw)} bytes, expected {n}")
        return np.frombuffer(raw, dtype).reshape(shape)

    def decode_scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        # python-lz4 decompresses into a buffer of its own, then copies it into the bytes object.
        return math.prod(shape) * dtype.itemsize
