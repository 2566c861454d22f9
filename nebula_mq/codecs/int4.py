"""Symmetric 4-bit quantisation in blocks, two values per byte, one float32 scale per block.

``int4`` (block 32, as llama.cpp's Q4_0 and close to bitsandbytes' 4-bit blocks) maps each value
to one of the 15 levels -7..7 of its block's scale max|block| / 7 and packs two levels per byte
(the first value of a pair in the low nibble). 5 bits per value at block 32 (4, and the float32
scale shared by 32 values): a payload ratio of 0.156 against float32, 6.4x smaller. The error per element is at most scale/2 = max|block| / 14 (plus float32
rounding of the scale), and at most 5e-31 in blocks below the scale floor. On real activations it
sits between int8 and low rank: see the codec rows of docs/benchmarks.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nebula_mq.codecs.base import Codec, EncodeContext, Encoded, check_finite, expect_parts
from nebula_mq.codecs.checks import cast_saturating, largest_scale, narrows
from nebula_mq.codecs.quantise import as_rows, block_count, rounded_levels, row_scales
from nebula_mq.errors import CodecError

LEVELS = 7  # levels -7..7 of the scale; nibble = level + 8 (nibble 0 is never sent: refused)


#: Scales are clamped to this on encode, so larger ones are forged.
SCALE_MAX = largest_scale(LEVELS)


@dataclass(frozen=True)
class Int4(Codec):
    wire_id = 8
    name = "int4"
    block: int = 32  # values per scale; even, so a block is whole bytes

    def __post_init__(self) -> None:
        if not (8 <= self.block <= 1 << 20 and self.block % 2 == 0):
            raise CodecError(f"int4: block must be even and 8..1048576, got {self.block}")

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        blocks = block_count(shape, self.block)
        return [((blocks * self.block // 2,), np.dtype(np.uint8)), ((blocks,), np.dtype(np.float32))]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        check_finite(x, ctx, "int4", representable=False)
        blocks, cols = block_count(x.shape, self.block), self.block
        x2 = as_rows(x, blocks, cols)
        scale = row_scales(x2, LEVELS, SCALE_MAX, "int4")
        packed = np.empty((blocks, cols // 2), np.uint8)
        for r0, levels in rounded_levels(x2, scale, LEVELS, clip=True):
            levels += np.float32(8.0)  # levels -7..7 -> nibbles 1..15
            nib = levels.astype(np.uint8)
            packed[r0:r0 + len(nib)] = nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4))
        return self._node(x, packed.reshape(-1), scale)

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        blocks, cols = block_count(shape, self.block), self.block
        expect_parts("int4", parts, ((blocks * cols // 2,), "uint8"), ((blocks,), "float32"))
        packed, scale = parts
        # The encoder clamps scales to SCALE_MAX, so larger ones are forged. NaN fails too.
        if scale.size and not (0.0 <= float(scale.min()) and float(scale.max()) <= SCALE_MAX):
            raise CodecError(f"int4: scales must be finite and in 0..{float(SCALE_MAX):.6g}")
        p = packed.reshape(blocks, cols // 2)
        levels = np.empty((blocks, cols), np.int8)
        levels[:, 0::2] = p & np.uint8(15)
        levels[:, 1::2] = p >> np.uint8(4)
        levels -= np.int8(8)
        # The encoder never sends nibble 0 (level -8): it is forged, and -8 x SCALE_MAX overflows.
        if levels.size and int(levels.min()) < -LEVELS:
            raise CodecError("int4: level -8 (nibble 0) is never encoded")
        out = levels.astype(np.float32)
        out *= scale[:, None]
        n = math.prod(shape)
        return cast_saturating(out.reshape(-1)[:n].reshape(shape), dtype)

    def decode_scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        padded = block_count(shape, self.block) * self.block
        n, work = math.prod(shape), 5 * padded  # the int8 levels and the float32 buffer
        if dtype == np.float32:
            return work - 4 * n
        return work + (n if narrows(np.dtype(np.float32), dtype) else 0)
