"""What a message would weigh under another codec, known from shapes and dtypes alone.

Every codec states the (shape, dtype) of the leaves an input encodes to (``Codec.layout``:
exact, except lz4's, which is data dependent and says the raw size), so the payload of a
tensor under any registered codec is known without encoding it; lz4 ties with ``none`` and
is never the one named. :func:`fitting_codecs` uses that
to name the codecs under which tensors too large for a message would fit: the least
compressing codec without parameters (one that makes them smaller), and the largest fraction
of a low-rank codec.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nebula_mq.codecs.base import Codec, registered
from nebula_mq.codecs.cast import Identity

#: Leaves are 8-byte aligned on the wire (``nebula_mq.wire.tree``).
LEAF_ALIGN = 8
#: Fractions tried for codecs with a ``fraction`` parameter, largest first: 0.9 ... 0.001.
FRACTIONS: tuple[float, ...] = tuple(round(m * 10.0 ** -e, e) for e in (1, 2, 3) for m in range(9, 0, -1))
#: Among low-rank codecs of equal size, the one named: the sketched SVD is as small as the
#: exact one and much faster on the large matrices an oversized message carries.
PREFERRED_LOW_RANK = ("rsvd", "svd", "powersgd")

TensorShape = tuple[tuple[int, ...], str]  # (shape, numpy dtype name) of one tensor


@dataclass(frozen=True)
class Fit:
    """A codec under which the tensors would fit: its spec, the estimated bytes, and for a
    low-rank codec the rank of the largest matrix."""

    spec: str
    nbytes: int
    rank: int | None = None


def _aligned(n: int) -> int:
    return -(-n // LEAF_ALIGN) * LEAF_ALIGN


def payload_bytes(codec: Codec, shape: tuple[int, ...], dtype: np.dtype | str) -> int:
    """Wire payload bytes of one tensor under ``codec`` (leaves 8-byte aligned); a dtype the
    codec does not take is counted raw."""
    dt = np.dtype(dtype)
    if not codec.accepts(dt):
        return _aligned(math.prod(shape) * dt.itemsize)
    return sum(_aligned(math.prod(s) * np.dtype(d).itemsize) for s, d in codec.layout(tuple(shape), dt))


def total_bytes(codec: Codec, tensors: Sequence[TensorShape]) -> int:
    return sum(payload_bytes(codec, shape, dtype) for shape, dtype in tensors)


def _required(cls: type[Codec]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def _largest_rank(codec: Codec, tensors: Sequence[TensorShape]) -> int | None:
    matrices = [s for s, _ in tensors if len(s) >= 2 and math.prod(s) > 0]
    if not matrices or not hasattr(codec, "rank"):
        return None
    *_, t, h = max(matrices, key=math.prod)
    return int(codec.rank(t, h))


def fitting_codecs(tensors: Sequence[TensorShape], budget: int) -> list[Fit]:
    """At most two codecs under which ``tensors`` take at most ``budget`` payload bytes: the
    parameterless codec that fits with the least compression (ties: the lower wire id), then
    the low-rank codec (one with a ``rank``) at the largest of :data:`FRACTIONS` that fits."""
    fixed: list[tuple[int, int, Fit]] = []
    low_rank: list[tuple[int, int, Fit]] = []
    raw = total_bytes(Identity(), tensors)
    for wire_id, cls in sorted(registered().items()):
        required = _required(cls)
        if not required:
            codec = cls()
            size = total_bytes(codec, tensors)
            # A codec that only transforms (hadamard: a rotation, padded) is no fix for a size.
            if size <= budget and (size < raw or cls is Identity):
                fixed.append((-size, wire_id, Fit(codec.spec, size)))
        elif required == ["fraction"] and hasattr(cls, "rank"):
            for fraction in FRACTIONS:
                codec = cls.from_params({"fraction": fraction})
                size = total_bytes(codec, tensors)
                if size <= budget:
                    order = PREFERRED_LOW_RANK.index(cls.name) if cls.name in PREFERRED_LOW_RANK else 99
                    low_rank.append((-size, order, Fit(codec.spec, size, _largest_rank(codec, tensors))))
                    break
    return [min(group, key=lambda g: g[:2])[2] for group in (fixed, low_rank) if group]
