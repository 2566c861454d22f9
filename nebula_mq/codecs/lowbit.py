"""Symmetric 3- and 2-bit quantisation in blocks, bit-packed, one float32 scale per block.

``int3`` maps each value to one of the 7 levels -3..3 of its block's scale max|block| / 3,
``int2`` to one of -1, 0, 1 (ternary, as TernGrad) of max|block|. A value's level plus the
largest level is its code (0..6, 0..2), packed ``bits`` to a value, least significant bit first
(eight codes to a little-endian word of ``bits`` bytes): 3.25 and 2.25 bits a value at the
default block of 128, 9.8x and 14.2x smaller than float32. The error per element is at most
scale/2 (max|block| / 6 and / 2).

Coarse on their own: they are meant under a rotation, ``int3(hadamard, block=128)``, which makes
a block's max a few times its RMS, and for gradients with error feedback, which carries what a
message rounds off into the same sample's next gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from nebula_mq.codecs.base import Codec, EncodeContext, Encoded, check_finite, expect_parts
from nebula_mq.codecs.checks import cast_saturating, largest_scale, narrows
from nebula_mq.codecs.quantise import as_rows, block_count, rounded_levels, row_scales
from nebula_mq.errors import CodecError


@dataclass(frozen=True)
class LowBit(Codec):
    """The shared implementation; :class:`Int3` and :class:`Int2` fix ``bits``."""

    bits: ClassVar[int]
    block: int = 128  # values per scale; a multiple of 8, so a block is whole bytes

    @property
    def levels(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @property
    def scale_max(self) -> np.float32:
        # Scales are clamped to this on encode, so larger ones are forged.
        return largest_scale(self.levels)

    def __post_init__(self) -> None:
        if not (8 <= self.block <= 1 << 20 and self.block % 8 == 0):
            raise CodecError(f"{self.name}: block must be a multiple of 8 in 8..1048576, got {self.block}")

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        blocks = block_count(shape, self.block)
        return [((blocks * self.block * self.bits // 8,), np.dtype(np.uint8)), ((blocks,), np.dtype(np.float32))]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        check_finite(x, ctx, self.name, representable=False)
        blocks, cols = block_count(x.shape, self.block), self.block
        x2 = as_rows(x, blocks, cols)
        scale = row_scales(x2, self.levels, self.scale_max, self.name)
        codes = np.empty((blocks, cols), np.uint8)
        for r0, levels in rounded_levels(x2, scale, self.levels, clip=True):
            levels += np.float32(self.levels)  # levels -L..L -> codes 0..2L
            codes[r0:r0 + len(levels)] = levels
        return self._node(x, self._pack(codes.reshape(-1, 8)), scale)

    def _pack(self, codes: np.ndarray) -> np.ndarray:
        """Each row of 8 codes into ``bits`` bytes: code i at bits ``bits`` x i.. of a little-endian
        32-bit word (8 x 3 bits fit), which is the bit stream, least significant bit first, that
        ``np.packbits`` would make of the codes' bits."""
        word = codes[:, 0].astype(np.uint32)
        for i in range(1, 8):
            word |= codes[:, i].astype(np.uint32) << np.uint32(self.bits * i)
        wire = word.astype("<u4", copy=False).view(np.uint8).reshape(-1, 4)[:, :self.bits]
        return np.ascontiguousarray(wire).reshape(-1)

    def _unpack(self, packed: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`_pack`: the codes, 8 a row."""
        wide = np.zeros((packed.size // self.bits, 4), np.uint8)
        wide[:, :self.bits] = packed.reshape(-1, self.bits)
        word = wide.view("<u4").reshape(-1)
        mask = np.uint32((1 << self.bits) - 1)
        codes = np.empty((word.size, 8), np.uint8)
        for i in range(8):
            codes[:, i] = (word >> np.uint32(self.bits * i)) & mask
        return codes

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        blocks, cols = block_count(shape, self.block), self.block
        expect_parts(self.name, parts, ((blocks * cols * self.bits // 8,), "uint8"), ((blocks,), "float32"))
        packed, scale = parts
        if scale.size and not (0.0 <= float(scale.min()) and float(scale.max()) <= self.scale_max):
            raise CodecError(f"{self.name}: scales must be finite and in 0..{float(self.scale_max):.6g}")
        codes = self._unpack(packed)
        # The encoder sends codes 0..2L only; a larger one is forged.
        if codes.size and int(codes.max()) > 2 * self.levels:
            raise CodecError(f"{self.name}: codes above {2 * self.levels} are never encoded")
        out = codes.astype(np.float32).reshape(blocks, cols)
        out -= np.float32(self.levels)
        out *= scale[:, None]
        return cast_saturating(out.reshape(-1)[:math.prod(shape)].reshape(shape), dtype)

    def decode_scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        padded = block_count(shape, self.block) * self.block
        # The words and two temporaries of shifted words (half a byte a value each), the codes (a
        # byte), the float32 buffer.
        n, work = math.prod(shape), 7 * padded
        if dtype == np.float32:
            return work - 4 * n
        return work + (n if narrows(np.dtype(np.float32), dtype) else 0)


@dataclass(frozen=True)
class Int3(LowBit):
    wire_id = 11
    name = "int3"
    bits: ClassVar[int] = 3


@dataclass(frozen=True)
class Int2(LowBit):
    wire_id = 12
    name = "int2"
    bits: ClassVar[int] = 2
