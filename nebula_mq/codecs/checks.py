"""Numeric guards shared by the codecs: byte order and saturating casts."""

from __future__ import annotations

import sys

import numpy as np

#: Largest finite float32; int8 scales and float32 low-rank factors must stay below it.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def largest_scale(steps: int) -> np.float32:
    """The largest float32 quantisation scale whose ``steps`` steps stay finite (float32 max / steps
    may round up). Encoders clamp their scales to it, so decoders refuse larger ones as forged."""
    scale = np.float32(FLOAT32_MAX) / np.float32(steps)
    with np.errstate(over="ignore"):
        while not np.isfinite(np.float32(steps) * scale):
            scale = np.nextafter(scale, np.float32(0))
    return scale


def is_little_endian(dtype: np.dtype) -> bool:
    order = dtype.byteorder  # "|": single bytes, "=": this machine's order
    return order == "<" or order == "|" or (order == "=" and sys.byteorder == "little")


def little_endian(x: np.ndarray) -> np.ndarray:
    """``x`` itself when its bytes are already little-endian (the wire order), else a converted copy.

    Codecs that work on raw bytes (lz4, the payload writer) would otherwise ship
    big-endian bytes under a dtype name that the receiver reads as little-endian.
    """
    if is_little_endian(x.dtype):
        return x
    return x.astype(x.dtype.newbyteorder("<"))


def narrows(src: np.dtype, dst: np.dtype) -> bool:
    """Whether casting float ``src`` to float ``dst`` can overflow (needs :func:`cast_saturating`'s mask)."""
    return src.kind == "f" and dst.kind == "f" and src.itemsize > dst.itemsize


def cast_saturating(scratch: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``scratch.astype(dtype)``, but finite values beyond ``dtype``'s range become its max, not Inf.

    Rounding can push a reconstruction just past the output range (bf16 rounds
    float16's 65504 up to 65536, a low-rank product of values near the limit
    overshoots it); the input was finite, so the output must be too. NaN and Inf
    already there are kept. ``scratch`` is the caller's temporary and is clipped in
    place; the only extra memory is a boolean mask, and only when narrowing.
    """
    if not narrows(scratch.dtype, dtype):
        return scratch.astype(dtype, copy=False)
    limit = float(np.finfo(dtype).max)
    if scratch.size and not (-limit <= float(scratch.min()) and float(scratch.max()) <= limit):  # true for NaN
        np.clip(scratch, -limit, limit, out=scratch, where=~np.isinf(scratch))  # a real Inf stays Inf
    return scratch.astype(dtype)
