"""Decoding codec trees: validation of every node, and a byte budget for the whole message.

A tree may come off the wire or be built in memory by anyone, so every field
of every node is checked before a codec sees it, and every failure is a
:class:`nebula_mq.errors.CodecError` subclass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from nebula_mq.codecs.base import MAX_NDIM, WIRE_DTYPES, Codec, Encoded, codec_class
from nebula_mq.errors import CodecError, DecodedTooLarge, ShapeMismatch

#: Bytes one decode may materialise when the caller gives no cap (envelopes derive
#: theirs from the largest accepted frame, see nebula_mq.wire.envelope).
DEFAULT_MAX_DECODED_BYTES = 4 * 1024**3
#: The wire dtypes as numpy dtypes in wire (little-endian) byte order, for fast part checks.
_WIRE_PART_DTYPES: frozenset[np.dtype] = frozenset(np.dtype(n).newbyteorder("<") for n in WIRE_DTYPES)


class DecodeBudget:
    """Bytes the decoder may still materialise for one message (all nodes, all tensors).

    Every node's output counts, intermediate ones included (the fp32 factors of
    ``fp16(svd)``, each level of a nested lz4), and while a node decodes so do its
    codec's temporaries (:meth:`Codec.decode_scratch`): that is what decoding
    allocates, and a hostile frame can make every node large while its payload
    stays tiny.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spent = 0

    def spend(self, nbytes: int, what: Callable[[], str]) -> None:
        self.require(nbytes, what)
        self.spent += nbytes

    def require(self, nbytes: int, what: Callable[[], str]) -> None:
        """Check that ``nbytes`` of temporaries still fit, without keeping them charged.

        ``what()`` names the node; it is only formatted for the error (decode is hot)."""
        if nbytes > self.limit - self.spent:
            raise DecodedTooLarge(f"{what()} would need {nbytes} more bytes; the cap is {self.limit} decoded "
                                  f"bytes per message and {self.spent} are already used")


def _check_node(enc: Encoded) -> tuple[type[Codec], dict[str, Any], tuple[int, ...], np.dtype]:
    """Validate an in-memory node's fields (they may come from anywhere); CodecError otherwise."""
    if type(enc.codec_id) is not int:
        raise CodecError(f"codec id must be an int, got {enc.codec_id!r}")
    cls = codec_class(enc.codec_id)
    if not isinstance(enc.params, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (int, float, str, bool)) for k, v in enc.params.items()
    ):
        raise CodecError(f"{cls.name}: params must map names to scalars, got {enc.params!r}")
    if not isinstance(enc.dtype, str) or enc.dtype not in WIRE_DTYPES:
        raise CodecError(f"{cls.name}: dtype {enc.dtype!r} is not allowed on the wire")
    shape = enc.shape
    if not isinstance(shape, (tuple, list)) or len(shape) > MAX_NDIM or any(type(d) is not int or d < 0 for d in shape):
        raise ShapeMismatch(f"{cls.name}: invalid shape {shape!r}")
    if not isinstance(enc.parts, (tuple, list)):
        raise CodecError(f"{cls.name}: parts must be a tuple, got {type(enc.parts).__name__}")
    for p in enc.parts:
        if isinstance(p, Encoded):
            continue
        if not isinstance(p, np.ndarray):
            raise CodecError(f"{cls.name}: part of type {type(p).__name__}")
        if p.dtype not in _WIRE_PART_DTYPES or p.ndim > MAX_NDIM:  # also refuses big-endian parts
            raise CodecError(f"{cls.name}: part of dtype {p.dtype.str} and {p.ndim} dims cannot come off the wire")
    return cls, dict(enc.params), tuple(shape), np.dtype(enc.dtype)


def decode_tree(enc: Encoded, *, max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
                budget: DecodeBudget | None = None) -> np.ndarray:
    """Decode a (possibly nested) node. Errors are always CodecError subclasses.

    At most ``max_decoded_bytes`` are materialised over the whole tree (or the
    shared ``budget`` of a whole message is drawn from).
    """
    return _decode_node(enc, budget if budget is not None else DecodeBudget(max_decoded_bytes), 0)


def _decode_node(enc: Encoded, budget: DecodeBudget, depth: int) -> np.ndarray:
    if depth > 8:
        raise CodecError("codec tree nested deeper than 8")
    if not isinstance(enc, Encoded):
        raise CodecError(f"expected an Encoded node, got {type(enc).__name__}")
    cls, params, shape, dtype = _check_node(enc)
    codec = cls.from_params(params)
    if not codec.accepts(dtype):  # no encoder makes such a node: its output would be garbage
        raise CodecError(f"{codec.spec}: cannot produce dtype {dtype}")
    # Before the children: a huge node is refused before any work is done for it.
    what = lambda: f"{codec.spec} node {dtype}{shape}"  # noqa: E731 - formatted only on refusal
    budget.spend(math.prod(shape) * dtype.itemsize, what)
    parts = tuple(_decode_node(p, budget, depth + 1) if isinstance(p, Encoded) else p for p in enc.parts)
    budget.require(codec.decode_scratch(shape, dtype), what)
    try:
        # A forged part can make arithmetic overflow; that is a refusal, not a warning.
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            out = codec._decode(parts, shape, dtype)
    except CodecError:
        raise
    except (ValueError, TypeError, IndexError, OverflowError, MemoryError, ArithmeticError,
            np.linalg.LinAlgError) as exc:
        raise CodecError(f"{codec.spec}: cannot decode: {exc}") from None
    if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dtype:
        got = f"{out.dtype}{out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ShapeMismatch(f"{codec.spec}: decoded {got}, expected {dtype}{shape}")
    return out
