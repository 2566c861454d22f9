"""Symmetric quantisation: ``int8``, ``int4``, ``int3`` and ``int2``.

All four take a 2-D view of the tensor (rows, or blocks of the flattened tensor padded with
zeros), keep one float32 scale per row, max|row| / L, and send each value's level -L..L of it,
``bits`` to a value; the rounded levels are computed chunk by chunk so the float temporaries
stay in L2 (~256 KiB). The error per element is at most scale/2 (plus float32 rounding of the
scale), and at most 5e-31 in rows below the scale floor. Scales are float32, so float64 inputs
beyond float32's range are refused rather than shipped as Inf; the encoder clamps them to the
largest scale whose levels stay finite, so a decoder refuses larger ones as forged.

* ``int8`` keeps one scale per row (the last axis: per token for [B,T,H] activations/gradients);
  ``int8(block=64)`` one per 64 consecutive values of the flattened tensor, which bounds the
  damage of a single outlier. Error at most max|row or block| / 254.
* ``int4`` (block 32, as llama.cpp's Q4_0 and close to bitsandbytes' 4-bit blocks) sends the 15
  levels -7..7 as nibbles level + 8, two per byte (the first value of a pair in the low nibble):
  5 bits per value at block 32, a payload ratio of 0.156 against float32, 6.4x smaller. Error at
  most max|block| / 14. On real activations it sits between int8 and low rank: see the codec rows
  of docs/benchmarks.md.
* ``int3`` sends the 7 levels -3..3, ``int2`` the levels -1, 0, 1 (ternary, as TernGrad). A
  value's level plus the largest level is its code (0..6, 0..2), packed ``bits`` to a value,
  least significant bit first (eight codes to a little-endian word of ``bits`` bytes): 3.25 and
  2.25 bits a value at the default block of 128, 9.8x and 14.2x smaller than float32. Error at
  most max|block| / 6 and / 2. Coarse on their own: they are meant under a rotation,
  ``int3(hadamard, block=128)``, which makes a block's max a few times its RMS, and for gradients
  with error feedback, which carries what a message rounds off into the same sample's next
  gradient.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from nebula_mq.codecs.base import (
    FLOAT32_MAX, Codec, EncodeContext, Encoded, cast_saturating, check_finite, expect_parts, largest_scale, narrows,
)
from nebula_mq.errors import CodecError

_CHUNK_ELEMS = 64 * 1024
# Scales never go below this: 1/scale stays finite for all-zero or subnormal rows (the
# error there is at most 5e-31).
SCALE_FLOOR = np.float32(1e-30)


def block_count(shape: tuple[int, ...], block: int) -> int:
    """How many blocks of ``block`` values hold a tensor of ``shape``, the last one padded."""
    return -(-math.prod(shape) // block)


def as_rows(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``x`` as ``rows`` x ``cols``, its flattened tail padded with zeros."""
    flat = x.reshape(-1)
    if rows * cols != flat.size:
        flat = np.concatenate([flat, np.zeros(rows * cols - flat.size, x.dtype)])
    return flat.reshape(rows, cols)


def row_scales(x2: np.ndarray, levels: int, scale_max: np.float32, codec: str) -> np.ndarray:
    """One float32 scale per row: max|row| / ``levels``, between the floor and ``scale_max``.
    Float64 rows beyond float32's range are refused rather than shipped as Inf."""
    if x2.size == 0:
        return np.full(x2.shape[0], SCALE_FLOOR, np.float32)
    amax = np.maximum(x2.max(axis=1), -x2.min(axis=1))  # in x's dtype: float64 may exceed float32
    if x2.dtype.itemsize > 4 and float(amax.max()) > FLOAT32_MAX:
        raise CodecError(f"{codec}: |x| up to {float(amax.max()):.3g} exceeds the float32 range of "
                         f"its scales ({FLOAT32_MAX:.3g}); use fp16, bf16 or none for such values")
    return np.clip(amax.astype(np.float32) / np.float32(levels), SCALE_FLOOR, scale_max)


def rounded_levels(x2: np.ndarray, scale: np.ndarray, levels: int, clip: bool) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, float32 levels) for consecutive chunks of rows; with ``clip``, clamped to
    -levels..levels (a pass int8 skips: its scales already bound them, and it is ~13% of its
    encode). The array is a reused buffer: use it before asking for the next chunk."""
    rows, cols = x2.shape
    inv = (np.float32(1.0) / scale)[:, None]
    step = max(1, _CHUNK_ELEMS // max(cols, 1))
    buf = np.empty((min(step, rows), cols), np.float32)
    for r0 in range(0, rows, step):
        part = x2[r0:r0 + step]
        b = buf[: part.shape[0]]
        np.multiply(part, inv[r0:r0 + step], out=b, casting="same_kind")
        np.rint(b, out=b)
        if clip:
            np.clip(b, -levels, levels, out=b)
        yield r0, b


class Quantiser(Codec):
    """What the four codecs share (module docstring): a subclass fixes ``bits``, how a chunk of
    levels is packed (``_pack``) and how the packed part is read back (``_levels``)."""

    block: int
    bits: ClassVar[int]
    #: The largest level L (levels -L..L) and the largest scale, from ``bits``.
    levels: ClassVar[int]
    scale_max: ClassVar[np.float32]
    #: The dtype of the packed part.
    part_dtype: ClassVar[np.dtype] = np.dtype(np.uint8)
    #: Whether the rounded levels are clamped to -L..L (int8's scales already bound them).
    clip: ClassVar[bool] = True
    #: Bytes ``_decode`` allocates per value of the padded 2-D view, its float32 buffer included.
    scratch_per_value: ClassVar[int]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "bits" in cls.__dict__:
            cls.levels = (1 << (cls.bits - 1)) - 1
            cls.scale_max = largest_scale(cls.levels)

    def _rows(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """(rows, cols) of the 2-D view that gets one scale per row."""
        return block_count(shape, self.block), self.block

    def _part_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        rows, cols = self._rows(shape)
        return (rows * cols * self.bits // 8,)

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        return [(self._part_shape(shape), self.part_dtype), ((self._rows(shape)[0],), np.dtype(np.float32))]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        check_finite(x, ctx, self.name, representable=False)
        rows, cols = self._rows(x.shape)
        x2 = as_rows(x, rows, cols)
        scale = row_scales(x2, self.levels, self.scale_max, self.name)
        packed = np.empty((rows, cols * self.bits // 8), self.part_dtype)
        for r0, levels in rounded_levels(x2, scale, self.levels, clip=self.clip):
            packed[r0:r0 + len(levels)] = self._pack(levels)
        return self._node(x, packed.reshape(self._part_shape(x.shape)), scale)

    @abstractmethod
    def _pack(self, levels: np.ndarray) -> np.ndarray:
        """A chunk of rows of float32 levels (a buffer it may change) as rows of the packed part."""

    @abstractmethod
    def _levels(self, packed: np.ndarray, rows: int, cols: int) -> np.ndarray:
        """The float32 levels, ``rows`` x ``cols``, of a packed part; a code the encoder never
        sends is refused as forged."""

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        rows, cols = self._rows(shape)
        expect_parts(self.name, parts, (self._part_shape(shape), self.part_dtype.name), ((rows,), "float32"))
        packed, scale = parts
        # The encoder clamps scales to scale_max, so larger ones are forged. NaN fails too.
        if scale.size and not (0.0 <= float(scale.min()) and float(scale.max()) <= self.scale_max):
            raise CodecError(f"{self.name}: scales must be finite and in 0..{float(self.scale_max):.6g}")
        out = self._levels(packed, rows, cols)
        out *= scale[:, None]
        return cast_saturating(out.reshape(-1)[:math.prod(shape)].reshape(shape), dtype)

    def decode_scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        rows, cols = self._rows(shape)
        n, work = math.prod(shape), self.scratch_per_value * rows * cols
        if dtype == np.float32:
            return work - 4 * n  # the float32 buffer is the output
        return work + (n if narrows(np.dtype(np.float32), dtype) else 0)


@dataclass(frozen=True)
class Int8(Quantiser):
    wire_id = 3
    name = "int8"
    bits = 8
    part_dtype = np.dtype(np.int8)
    clip = False
    scratch_per_value = 4  # the float32 buffer
    block: int = 0  # 0: one scale per row (last axis); else values per scale block

    def __post_init__(self) -> None:
        if self.block != 0 and not 8 <= self.block <= 1 << 20:
            raise CodecError(f"int8: block must be 0 (per row) or 8..1048576, got {self.block}")

    def _rows(self, shape: tuple[int, ...]) -> tuple[int, int]:
        if self.block:
            return super()._rows(shape)
        cols = shape[-1] if shape else 1
        return (math.prod(shape) // cols if cols else 0), cols

    def _part_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return super()._part_shape(shape) if self.block else tuple(shape)

    def _pack(self, levels: np.ndarray) -> np.ndarray:
        return levels

    def _levels(self, packed: np.ndarray, rows: int, cols: int) -> np.ndarray:
        # Only a forged -128 can overflow once scaled: decode_tree refuses that.
        return packed.reshape(rows, cols).astype(np.float32)


@dataclass(frozen=True)
class Int4(Quantiser):
    wire_id = 8
    name = "int4"
    bits = 4
    scratch_per_value = 5  # the int8 levels and the float32 buffer
    block: int = 32  # values per scale; even, so a block is whole bytes

    def __post_init__(self) -> None:
        if not (8 <= self.block <= 1 << 20 and self.block % 2 == 0):
            raise CodecError(f"int4: block must be even and 8..1048576, got {self.block}")

    def _pack(self, levels: np.ndarray) -> np.ndarray:
        levels += np.float32(8.0)  # levels -7..7 -> nibbles 1..15
        nib = levels.astype(np.uint8)
        return nib[:, 0::2] | (nib[:, 1::2] << np.uint8(4))

    def _levels(self, packed: np.ndarray, rows: int, cols: int) -> np.ndarray:
        p = packed.reshape(rows, cols // 2)
        levels = np.empty((rows, cols), np.int8)
        levels[:, 0::2] = p & np.uint8(15)
        levels[:, 1::2] = p >> np.uint8(4)
        levels -= np.int8(8)
        # The encoder never sends nibble 0 (level -8): it is forged, and -8 x scale_max overflows.
        if levels.size and int(levels.min()) < -self.levels:
            raise CodecError("int4: level -8 (nibble 0) is never encoded")
        return levels.astype(np.float32)


@dataclass(frozen=True)
class LowBit(Quantiser):
    """Bit-packed codes: :class:`Int3` and :class:`Int2` fix ``bits``."""

    # The words and two temporaries of shifted words (half a byte a value each), the codes (a
    # byte), the float32 buffer.
    scratch_per_value = 7
    block: int = 128  # values per scale; a multiple of 8, so a block is whole bytes

    def __post_init__(self) -> None:
        if not (8 <= self.block <= 1 << 20 and self.block % 8 == 0):
            raise CodecError(f"{self.name}: block must be a multiple of 8 in 8..1048576, got {self.block}")

    def _pack(self, levels: np.ndarray) -> np.ndarray:
        """Codes (level + L) 8 at a time into ``bits`` bytes: code i at bits ``bits`` x i.. of a
        little-endian 32-bit word (8 x 3 bits fit), which is the bit stream, least significant bit
        first, that ``np.packbits`` would make of the codes' bits."""
        levels += np.float32(self.levels)  # levels -L..L -> codes 0..2L
        codes = levels.astype(np.uint8).reshape(-1, 8)
        word = codes[:, 0].astype(np.uint32)
        for i in range(1, 8):
            word |= codes[:, i].astype(np.uint32) << np.uint32(self.bits * i)
        wire = word.astype("<u4", copy=False).view(np.uint8).reshape(-1, 4)[:, :self.bits]
        return wire.reshape(len(levels), -1)

    def _levels(self, packed: np.ndarray, rows: int, cols: int) -> np.ndarray:
        wide = np.zeros((packed.size // self.bits, 4), np.uint8)
        wide[:, :self.bits] = packed.reshape(-1, self.bits)
        word = wide.view("<u4").reshape(-1)
        mask = np.uint32((1 << self.bits) - 1)
        codes = np.empty((word.size, 8), np.uint8)
        for i in range(8):
            codes[:, i] = (word >> np.uint32(self.bits * i)) & mask
        # The encoder sends codes 0..2L only; a larger one is forged.
        if codes.size and int(codes.max()) > 2 * self.levels:
            raise CodecError(f"{self.name}: codes above {2 * self.levels} are never encoded")
        out = codes.astype(np.float32).reshape(rows, cols)
        out -= np.float32(self.levels)
        return out


@dataclass(frozen=True)
class Int3(LowBit):
    wire_id = 11
    name = "int3"
    bits = 3


@dataclass(frozen=True)
class Int2(LowBit):
    wire_id = 12
    name = "int2"
    bits = 2
