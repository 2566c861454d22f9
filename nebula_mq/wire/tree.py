"""Encoded trees <-> msgpack-able headers plus one payload blob.

A node becomes ``[codec_id, params, shape, dtype, [part, ...]]``; an array part
becomes ``[dtype, shape, offset, nbytes]`` pointing into the payload blob. Parts
follow each other in tree order, each 8-byte aligned and zero-padded, with
nothing after the last; the decoder accepts only that layout and slices the
received buffer with ``np.frombuffer`` instead of copying payloads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from nebula_mq.codecs.base import MAX_NDIM, WIRE_DTYPES, Encoded, Part, little_endian
from nebula_mq.errors import MalformedMessage

ALIGN = 8
MAX_DEPTH = 8
MAX_PARTS = 64
_SCALARS = (int, float, str, bool)


def pad(n: int) -> int:
    return -n % ALIGN


class PayloadWriter:
    """Collects array buffers; offsets are relative to the start of the blob."""

    def __init__(self) -> None:
        self.chunks: list[memoryview] = []
        self.size = 0

    def add(self, arr: np.ndarray) -> list[Any]:
        # asarray, not ascontiguousarray: that one turns a 0-d part into shape (1,).
        arr = little_endian(np.asarray(arr, order="C"))  # the wire is little-endian
        offset = self.size
        self.chunks.append(memoryview(arr.reshape(-1).view(np.uint8)))  # type: ignore[arg-type]
        self.size += arr.nbytes
        if pad(self.size):
            self.chunks.append(memoryview(bytes(pad(self.size))))
            self.size += pad(self.size)
        return [arr.dtype.name, list(arr.shape), offset, arr.nbytes]


def tree_to_wire(enc: Encoded, out: PayloadWriter) -> list[Any]:
    parts = [tree_to_wire(p, out) if isinstance(p, Encoded) else out.add(p) for p in enc.parts]
    return [enc.codec_id, dict(enc.params), list(enc.shape), enc.dtype, parts]


def _shape(raw: Any, what: str) -> tuple[int, ...]:
    if not isinstance(raw, (list, tuple)) or len(raw) > MAX_NDIM:
        raise MalformedMessage(f"{what}: shape must be a list of at most {MAX_NDIM} ints")
    if not all(type(d) is int and 0 <= d < 2**40 for d in raw):
        raise MalformedMessage(f"{what}: shape dims must be ints in 0..2**40")
    return tuple(raw)


def _dtype(raw: Any, what: str) -> str:
    if not isinstance(raw, str) or raw not in WIRE_DTYPES:
        raise MalformedMessage(f"{what}: dtype {raw!r} not allowed")
    return raw


def _params(raw: Any, what: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or len(raw) > 16:
        raise MalformedMessage(f"{what}: params must be a small map")
    for k, v in raw.items():
        if not isinstance(k, str) or not isinstance(v, _SCALARS):
            raise MalformedMessage(f"{what}: params must map names to scalars")
    return dict(raw)


class PayloadReader:
    """Hands out the blob's array parts in the order the writer laid them out.

    Each part must start exactly where the previous one's padding ends (the
    first at 0) and the blob must end with the last part's padding, so no two
    parts share bytes, every part is 8-byte aligned and nothing is appended.
    Parts sharing one payload would let a tiny frame decode to many tensors.
    """

    def __init__(self, blob: memoryview) -> None:
        self.blob = blob
        self.cursor = 0

    def take(self, dtype: np.dtype, shape: tuple[int, ...], offset: int, nbytes: int) -> np.ndarray:
        if offset != self.cursor:
            problem = ("is not 8-byte aligned" if offset % ALIGN
                       else "overlaps an earlier part" if offset < self.cursor
                       else f"leaves a gap of {offset - self.cursor} bytes")
            raise MalformedMessage(f"array part at offset {offset} {problem}; expected offset {self.cursor}")
        end = offset + nbytes
        if end + pad(end) > len(self.blob):
            raise MalformedMessage("array part points past the end of the payload")
        if any(self.blob[end:end + pad(end)]):
            raise MalformedMessage(f"non-zero padding after the array part at offset {offset}")
        self.cursor = end + pad(end)
        # Zero-copy: a view on the received buffer, never a copy of the payload.
        arr = np.frombuffer(self.blob, dtype=dtype.newbyteorder("<"), count=math.prod(shape), offset=offset)
        return arr.reshape(shape)

    def finish(self) -> None:
        if self.cursor != len(self.blob):
            raise MalformedMessage(f"{len(self.blob) - self.cursor} trailing bytes after the last array part")


def tree_from_wire(raw: Any, reader: PayloadReader, depth: int = 0) -> Encoded:
    """Rebuild a node; parts are zero-copy views on the blob. Errors: MalformedMessage."""
    if depth > MAX_DEPTH:
        raise MalformedMessage("codec tree nested too deep")
    if not isinstance(raw, (list, tuple)) or len(raw) != 5:
        raise MalformedMessage("codec node must be [id, params, shape, dtype, parts]")
    codec_id, params, shape, dtype, parts = raw
    if type(codec_id) is not int or not 0 <= codec_id < 128:
        raise MalformedMessage(f"codec id {codec_id!r} out of range")
    if not isinstance(parts, (list, tuple)) or len(parts) > MAX_PARTS:
        raise MalformedMessage("codec node parts must be a short list")
    out: list[Part] = []
    for part in parts:
        if isinstance(part, (list, tuple)) and len(part) == 5:
            out.append(tree_from_wire(part, reader, depth + 1))
        else:
            out.append(_array(part, reader))
    return Encoded(codec_id, _params(params, "codec"), _shape(shape, "codec"), _dtype(dtype, "codec"), tuple(out))


def _array(raw: Any, reader: PayloadReader) -> np.ndarray:
    if not isinstance(raw, (list, tuple)) or len(raw) != 4:
        raise MalformedMessage("array part must be [dtype, shape, offset, nbytes]")
    dtype, shape, offset, nbytes = np.dtype(_dtype(raw[0], "part")), _shape(raw[1], "part"), raw[2], raw[3]
    if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0:
        raise MalformedMessage("array part offset/nbytes must be non-negative ints")
    if math.prod(shape) * dtype.itemsize != nbytes:
        raise MalformedMessage(f"array part of {dtype}{shape} cannot be {nbytes} bytes")
    return reader.take(dtype, shape, offset, nbytes)
