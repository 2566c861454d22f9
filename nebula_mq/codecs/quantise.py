"""Symmetric quantisation shared by ``int8`` and ``int4``: a 2-D view of the tensor (rows, or
blocks of the flattened tensor padded with zeros), one float32 scale per row, and the rounded
levels computed chunk by chunk so the float temporaries stay in L2 (~256 KiB)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from nebula_mq.codecs.checks import FLOAT32_MAX
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
