"""A randomised Hadamard rotation in blocks, to go under a quantiser: ``int4(hadamard)``.

One outlier channel sets the scale of every block it sits in, and a 4-bit grid sized for it rounds
the block's other values to zero. ``hadamard`` rotates each block of the flattened tensor by one
fixed orthonormal matrix, H diag(signs) / sqrt(block) with H the Walsh-Hadamard matrix and random
signs (QuaRot, Ashkboos et al. 2024; QuIP#). The outlier's energy is spread over the whole block,
so the values the quantiser sees are close to Gaussian: a block's max is about 3x its RMS, not 20x.
The rotation is orthonormal, so the quantiser's error comes back the same size, spread evenly over
the block.

Its one part is the rotated tensor, flattened and padded with zeros to whole blocks: float32 (float64
for float64 input), larger than the input until a quantiser encodes it. The signs come from the
``seed`` parameter alone, so both ends build the same rotation. It is computed by the fast
Walsh-Hadamard transform: log2(block) passes of elementwise sums and differences, no matrix and no
BLAS, so every machine rounds it the same way (delta compression keeps a copy of the reference at
each end, and the two must stay bit-identical). The rotation adds about log2(block) roundings of
the block's largest |x| to each value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nebula_mq.codecs.base import (
    Codec, EncodeContext, Encoded, cast_saturating, check_finite, expect_parts, narrows, work_dtype,
)
from nebula_mq.codecs.quantise import as_rows, block_count
from nebula_mq.errors import CodecError

MAX_BLOCK = 1 << 16
CHUNK_ELEMS = 16 * 1024  # values transformed at a time: the chunk and its two buffers stay in L2


def signs(block: int, seed: int) -> np.ndarray:
    """The ``block`` random signs, +-1.0. PCG64's raw stream is fixed across numpy versions
    (Generator methods may change), and the two ends of a flow may run different numpy builds."""
    return np.where(np.random.PCG64(seed).random_raw(block) & np.uint64(1), -1.0, 1.0)


def walsh_hadamard(rows: np.ndarray) -> np.ndarray:
    """H @ each row of ``rows``, in place and returned (H the Sylvester-ordered Hadamard matrix,
    entries +-1): butterflies (a + b, a - b) over pairs 1, 2, 4, ... apart. A chunk of rows at a
    time, transposed, so that each butterfly adds two contiguous runs of values in L2: on the
    rows themselves, pairs 2..8 apart are numpy's slowest loops (3x the time in all)."""
    n, block = rows.shape
    step = max(1, CHUNK_ELEMS // block)
    for r0 in range(0, n, step):
        part = rows[r0:r0 + step]
        src = np.ascontiguousarray(part.T)
        dst = np.empty_like(src)
        half = 1
        while half < block:
            a = src.reshape(block // (2 * half), 2, half * len(part))
            b = dst.reshape(block // (2 * half), 2, half * len(part))
            np.add(a[:, 0], a[:, 1], out=b[:, 0])
            np.subtract(a[:, 0], a[:, 1], out=b[:, 1])
            src, dst = dst, src
            half *= 2
        part[...] = src.T
    return rows


@dataclass(frozen=True)
class Hadamard(Codec):
    wire_id = 10
    name = "hadamard"
    block: int = 128  # values per rotation; a power of two
    seed: int = 0  # of the random signs

    def __post_init__(self) -> None:
        if not (2 <= self.block <= MAX_BLOCK and self.block & (self.block - 1) == 0):
            raise CodecError(f"hadamard: block must be a power of two in 2..{MAX_BLOCK}, got {self.block}")
        if not 0 <= self.seed < 1 << 32:
            raise CodecError(f"hadamard: seed must be in 0..{(1 << 32) - 1}, got {self.seed}")

    def _padded(self, shape: tuple[int, ...]) -> int:
        return block_count(shape, self.block) * self.block

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        return [((self._padded(shape),), work_dtype(np.dtype(dtype)))]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        # NaN or Inf would smear over its whole block: refused even with allow_non_finite.
        check_finite(x, ctx, "hadamard", representable=False)
        work = work_dtype(x.dtype)
        limit = self.input_limit(work)
        if x.size and not (-limit <= float(x.min()) and float(x.max()) <= limit):
            raise CodecError(f"hadamard: |x| up to {float(np.abs(x).max()):.3g} may overflow {work.name} once "
                             f"rotated (the limit at block {self.block} is {limit:.3g}); use fp16, bf16 or none")
        n = self._padded(x.shape)
        # Signs and the 1/sqrt(block) first: every partial sum then stays within sqrt(block) x max|x|.
        rows = as_rows(x, n // self.block, self.block) * self._scaled_signs(work)
        return self._node(x, walsh_hadamard(rows).reshape(-1))

    def _scaled_signs(self, work: np.dtype) -> np.ndarray:
        return (signs(self.block, self.seed) / math.sqrt(self.block)).astype(work)

    def input_limit(self, work: np.dtype) -> float:
        """The largest |x| rotated: every partial sum stays within sqrt(block) x max|x|, and half
        the range leaves room for rounding and for a quantiser above."""
        return float(np.finfo(work).max) / (2 * math.sqrt(self.block))

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        work = work_dtype(dtype)
        n = self._padded(shape)
        expect_parts("hadamard", parts, ((n,), work.name))
        (rotated,) = parts
        # The inverse is the transpose, diag(signs) H / sqrt(block) (H is symmetric); the scaling
        # first, so a legitimate part's partial sums stay in range.
        scaled = rotated.reshape(-1, self.block) * np.asarray(1.0 / math.sqrt(self.block), work)
        out = (walsh_hadamard(scaled) * signs(self.block, self.seed).astype(work)).reshape(-1)
        # NaN, Inf or values that overflow on the way back were never encoded: forged.
        if out.size and not (math.isfinite(float(out.min())) and math.isfinite(float(out.max()))):
            raise CodecError("hadamard: the rotated values do not decode to finite values")
        return cast_saturating(out[:math.prod(shape)].reshape(shape), dtype)

    def decode_scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        work = work_dtype(dtype)
        n, padded = math.prod(shape), self._padded(shape) * work.itemsize
        chunk = min(self._padded(shape), max(CHUNK_ELEMS, self.block)) * work.itemsize
        scratch = 2 * padded + 2 * chunk  # the scaled part, the signed result, the chunk's two buffers
        if dtype == work:
            return scratch - n * work.itemsize  # the signed result is the output
        return scratch + (n if narrows(work, dtype) else 0)  # cast_saturating's mask
