"""Symmetric int8 quantisation with one float32 scale per row or per block.

``int8`` keeps one scale per row (the last axis: per token for [B,T,H]
activations/gradients); ``int8(block=64)`` one per 64 consecutive values of the
flattened tensor, which bounds the damage of a single outlier. The error per
element is at most scale/2 = max|row or block| / 254 (plus float32 rounding of the
scale), and at most 5e-31 in rows below the scale floor. Scales are float32, so
float64 inputs beyond float32's range are refused rather than shipped as Inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nebula_mq.codecs.base import Codec, EncodeContext, Encoded, check_finite, expect_parts
from nebula_mq.codecs.checks import cast_saturating, largest_scale, narrows
from nebula_mq.codecs.quantise import as_rows, block_count, rounded_levels, row_scales
from nebula_mq.errors import CodecError



#: Scales are clamped to this on encode, so larger ones are forged.
SCALE_MAX = largest_scale(127)


@dataclass(frozen=True)
class Int8(Codec):
    wire_id = 3
    name = "int8"
    block: int = 0  # 0: one scale per row (last axis); else values per scale block

    def __post_init__(self) -> None:
        if self.block != 0 and not 8 <= self.block <= 1 << 20:
            raise CodecError(f"int8: block must be 0 (per row) or 8..1048576, got {self.block}")

    def _layout(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """(rows, cols) of the 2-D view that gets one scale per row."""
        if self.block:
            return block_count(shape, self.block), self.block
        cols = shape[-1] if shape else 1
        return (math.prod(shape) // cols if cols else 0), cols

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        rows, cols = self._layout(shape)
        q_shape = (rows * cols,) if self.block else shape
        return [(q_shape, np.dtype(np.int8)), ((rows,), np.dtype(np.float32))]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        check_finite(x, ctx, "int8", representable=False)
        rows, cols = self._layout(x.shape)
        x2 = as_rows(x, rows, cols)
        scale = row_scales(x2, 127, SCALE_MAX, "int8")
        q = np.empty((rows, cols), np.int8)
        for r0, levels in rounded_levels(x2, scale, 127, clip=False):
            q[r0:r0 + len(levels)] = levels
        q_out = q.reshape(x.shape) if not self.block else q.reshape(-1)
        return self._node(x, q_out, scale)

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        rows, cols = self._layout(shape)
        q_shape = (rows * cols,) if self.block else shape
        expect_parts("int8", parts, (q_shape, "int8"), ((rows,), "float32"))
        q, scale = parts
        # The encoder clamps scales to SCALE_MAX, so larger ones are forged. NaN fails too.
        if scale.size and not (0.0 <= float(scale.min()) and float(scale.max()) <= SCALE_MAX):
            raise CodecError(f"int8: scales must be finite and in 0..{float(SCALE_MAX):.6g}")
        out = q.reshape(rows, cols).astype(np.float32)
        out *= scale[:, None]  # only a forged -128 can overflow: decode_tree refuses that
        n = math.prod(shape)
        return cast_saturating(out.reshape(-1)[:n].reshape(shape), dtype)

    def decode_scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        rows, cols = self._layout(shape)
        n, work = math.prod(shape), 4 * rows * cols  # the float32 buffer, padded to whole blocks
        if dtype == np.float32:
            return work - 4 * n  # the buffer is the output
        return work + (n if narrows(np.dtype(np.float32), dtype) else 0)
