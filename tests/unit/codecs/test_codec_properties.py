"""The codec x dtype x shape grid: every accepted input either is refused with a typed error for a
documented reason, or round-trips (directly and through an envelope) to the right shape and dtype,
finite, within the codec's documented error bound (bit-exact for lossless codecs).

Inputs (tests/fixtures/arrays.py) include 0-d and empty shapes, big-endian, strided and Fortran
layouts, and values from subnormals and signed zeros up to float64's largest.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings

from nebula_mq.codecs import Chain, Codec, decode_tree, parse_codec
from nebula_mq.codecs.cast import BF16_SAFE_MAX, FP16_MAX
from nebula_mq.codecs.hadamard import Hadamard
from nebula_mq.codecs.lowrank import SVD, PowerSGD, RandomizedSVD
from nebula_mq.errors import CodecError, NebulaError
from nebula_mq.wire import Envelope, TensorRecord, decode_envelope, encode_envelope, unpack_tensors
from tests.fixtures.arrays import FLOAT_DTYPES, INT_DTYPES, codec_inputs

F32_MAX = float(np.finfo(np.float32).max)
LOSSLESS = ["none", "lz4"]
LOSSY = ["fp16", "bf16", "int8", "int8(block=8)", "int4", "int4(block=8)", "int3", "int3(block=8)", "int2(block=16)",
         "hadamard", "hadamard(block=8, seed=7)", "svd(0.5)", "rsvd(0.5)", "rsvd(0.3, iters=0)",
         "powersgd(0.5)", "topk(0.3)"]
CHAINS = ["fp16(svd(0.5))", "int8(rsvd(0.5))", "int4(svd(0.5))", "bf16(svd(0.6))", "fp16(powersgd(0.5))",
          "int8(powersgd(0.3))", "lz4(topk(0.3))", "lz4(fp16)", "int4(hadamard(16), block=16)", "int3(hadamard)"]
LOWRANK = ("svd", "rsvd", "powersgd")
QUANTISED = {"int8": 127, "int4": 7, "int3": 3, "int2": 1}  # levels each side of zero


def _native(x: np.ndarray) -> np.ndarray:
    """``x``'s values, C-ordered and little-endian: what a bit-exact decode must return."""
    return np.array(x, dtype=np.dtype(x.dtype.name), order="C")


def _amax(x: np.ndarray) -> float:
    return float(np.abs(x.astype(np.float64)).max()) if x.size else 0.0


def documented_refusal(codec: Codec, x: np.ndarray) -> bool:
    """Whether the codec's documentation says it refuses ``x`` (a finite input of an accepted dtype)."""
    if isinstance(codec, Chain):  # refused by the inner codec, or by the outer one on a leaf it accepts
        if documented_refusal(codec.inner, x):
            return True
        leaves = codec.inner.encode(x).leaves()
        return any(codec.outer.accepts(p.dtype) and documented_refusal(codec.outer, p) for p in leaves)
    if codec.name in QUANTISED:  # scales are float32
        return x.dtype.name == "float64" and _amax(x) > F32_MAX
    if isinstance(codec, Hadamard):  # partial sums of a rotated value must stay in range
        work = np.float64 if x.dtype.name == "float64" else np.float32
        return _amax(x) > float(np.finfo(work).max) / (2 * math.sqrt(codec.block))
    if isinstance(codec, (SVD, RandomizedSVD, PowerSGD)) and x.ndim >= 2 and x.size:
        work = np.float64 if x.dtype.name == "float64" else np.float32
        # powersgd's right factor carries the magnitude along columns (T values), the others' left along rows (H)
        n = max(x.shape[-2:]) if isinstance(codec, PowerSGD) else x.shape[-1]
        return _amax(x) > float(np.finfo(work).max) / (2 * math.sqrt(n))
    return False


def roundtrip(codec: Codec, x: np.ndarray) -> np.ndarray | None:
    """Decoded array, or None after a documented, typed refusal; the wire must decode the same."""
    try:
        enc = codec.encode(x)
    except NebulaError as exc:
        assert isinstance(exc, CodecError) and documented_refusal(codec, x), f"undocumented refusal: {exc!r}"
        return None
    assert not documented_refusal(codec, x), "a documented refusal was not made"
    y = decode_tree(enc)
    assert y.shape == x.shape and y.dtype == np.dtype(x.dtype.name)
    if x.dtype.kind == "f":
        assert np.isfinite(y).all(), "finite input decoded to NaN/Inf"
    record = TensorRecord("x", tuple(x.shape), x.dtype.name, codec.spec, enc)
    frame = encode_envelope(Envelope("j", "f", 0, 0, 0, "p", (record,)))
    wired = unpack_tensors(decode_envelope(frame, max_bytes=1 << 24))["x"]
    assert wired.shape == y.shape and wired.dtype == y.dtype and wired.tobytes() == y.tobytes()
    return y


def assert_within_bound(spec: str, x: np.ndarray, y: np.ndarray) -> None:
    """The error bound each codec documents (see its module docstring)."""
    name = spec.split("(")[0]
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    eps = float(np.finfo(x.dtype).eps) if x.dtype.kind == "f" else 0.0
    if name in ("none", "lz4") or (name in LOWRANK and (x.ndim < 2 or x.size == 0)):
        assert y.tobytes() == _native(x).tobytes()  # lossless (low-rank sends < 2-D tensors raw)
    elif name == "fp16":  # clamped to +-65504, then 11-bit mantissa or subnormal spacing
        xc = np.clip(x64, -FP16_MAX, FP16_MAX)
        assert np.all(np.abs(y64 - xc) <= np.abs(xc) * 2.0**-11 + 2.0**-24)
    elif name == "bf16":  # clamped to the largest finite bf16, then 8-bit mantissa
        xc = np.clip(x64, -BF16_SAFE_MAX, BF16_SAFE_MAX)
        assert np.all(np.abs(y64 - xc) <= np.abs(xc) * 2.0**-8 + 2.0**-126)
    elif name in QUANTISED:
        _assert_quantised_bound(parse_codec(spec).block, x64, y64, eps, QUANTISED[name])  # type: ignore[attr-defined]
    elif name == "hadamard":
        _assert_rotation_bound(parse_codec(spec).block, x, x64, y64)  # type: ignore[attr-defined]
    elif name in LOWRANK:
        _assert_lowrank_bound(parse_codec(spec), x, y)
    elif name == "topk":  # kept values exact, the rest zero, nothing dropped larger than the k-th
        xn = _native(x)
        assert np.all((y == xn) | (y == 0))
        k = parse_codec(spec).count(x.size)  # type: ignore[attr-defined]
        if x.size:
            kth = np.sort(np.abs(x64).reshape(-1))[x.size - k]
            assert float(np.abs(y64 - x64).max()) <= kth
    else:  # pragma: no cover - a spec added to the grid without a bound
        raise AssertionError(f"no documented bound for {spec}")


def _assert_quantised_bound(block: int, x64: np.ndarray, y64: np.ndarray, eps: float, levels: int) -> None:
    """Symmetric quantisation to ``levels`` steps each side of zero, per row (block 0) or block."""
    if x64.size == 0:
        return
    if block:
        flat = np.concatenate([np.abs(x64).reshape(-1), np.zeros(-x64.size % block)]).reshape(-1, block)
        amax = np.repeat(flat.max(axis=1), block)[: x64.size].reshape(x64.shape)
    else:
        amax = np.abs(x64).max(axis=-1, keepdims=True) if x64.ndim else np.abs(x64)
    # half a step (max/254 for int8, max/14 for int4, max/6 for int3, max/2 for int2) plus float32 rounding of the scale, rounding
    # into the output dtype, and the scale floor (rows below ~1e-28 quantise with error <= 5e-31)
    assert np.all(np.abs(y64 - x64) <= amax / (2 * levels) + 2.5e-7 * amax + np.abs(x64) * eps + 5e-31)


def _assert_rotation_bound(block: int, x: np.ndarray, x64: np.ndarray, y64: np.ndarray) -> None:
    """log2(block) sums and differences each way in the working precision, each value within
    sqrt(block) x the block's max (or its subnormal spacing, below the normal range), then rounding
    into the output dtype and its subnormal spacing."""
    if x64.size == 0:
        return
    work = np.finfo(np.float64 if x.dtype.name == "float64" else np.float32)
    flat = np.concatenate([np.abs(x64).reshape(-1), np.zeros(-x64.size % block)]).reshape(-1, block)
    amax = np.repeat(flat.max(axis=1), block)[: x64.size].reshape(x64.shape)
    out = np.finfo(x.dtype)
    bound = (4 * math.log2(block) * math.sqrt(block) * float(work.eps) * amax + 4 * block * float(work.smallest_subnormal)
             + np.abs(x64) * float(out.eps) + float(out.smallest_subnormal))
    assert np.all(np.abs(y64 - x64) <= bound)


def _assert_lowrank_bound(codec: Codec, x: np.ndarray, y: np.ndarray) -> None:
    scale = _amax(x)
    if scale == 0:
        assert not y.any()
        return
    t, h = x.shape[-2:]
    xn = x.astype(np.float64).reshape(-1, t, h) / scale  # normalised: norms of 1e300 overflow
    yn = y.astype(np.float64).reshape(-1, t, h) / scale
    err, norm = float(np.linalg.norm(yn - xn)), float(np.linalg.norm(xn))
    # working precision (float32 factors), rounding into the output dtype, its subnormal spacing
    out = np.finfo(x.dtype)
    slack = (1e-3 * norm + float(out.eps) * float(np.linalg.norm(yn))
             + math.sqrt(x.size) * float(out.smallest_subnormal) / scale)
    if isinstance(codec, SVD):  # exactly the discarded singular energy
        k = codec.rank(t, h)
        discarded = math.sqrt(float(np.sum(np.linalg.svd(xn, compute_uv=False)[:, k:] ** 2)))
        assert err <= discarded + slack
    else:  # rsvd and powersgd project onto a subspace: never worse than sending zeros
        assert err <= norm + slack


@pytest.mark.parametrize("spec", LOSSLESS + LOSSY)
@given(data=codec_inputs(FLOAT_DTYPES + INT_DTYPES))
@settings(max_examples=120, deadline=None)
def test_codec_grid(spec: str, data: np.ndarray) -> None:
    codec = parse_codec(spec)
    if not codec.accepts(data.dtype):
        with pytest.raises(CodecError, match="cannot encode dtype"):
            codec.encode(data)
        return
    y = roundtrip(codec, data)
    if y is not None:
        assert_within_bound(spec, data, y)


@pytest.mark.parametrize("spec", CHAINS)
@given(data=codec_inputs(FLOAT_DTYPES))
@settings(max_examples=60, deadline=None)
def test_chain_grid(spec: str, data: np.ndarray) -> None:
    """Chains have no error bound of their own; they must still refuse or decode finitely."""
    y = roundtrip(parse_codec(spec), data)
    if y is not None and spec == "lz4(topk(0.3))":
        assert_within_bound("topk(0.3)", data, y)
