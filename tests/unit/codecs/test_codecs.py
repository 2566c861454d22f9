"""Property tests of every codec: round-trip error bounds, ratios, composition, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from nebula_mq.codecs import (
    FP16, LZ4, SVD, CompressionSchedule, Identity, Int4, Int8, LowRankState, RandomizedSVD, TopK,
    decode_tree, parse_codec, registered,
)
from nebula_mq.codecs.base import Codec, Encoded
from nebula_mq.errors import CodecError, DecodedTooLarge, NonFiniteTensor, ShapeMismatch, UnknownCodec
from tests.fixtures.refusals import assert_decode_refused

FLOATS = [np.float32, np.float16, np.float64]
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=24)


def floats_array(dtype: type, shape_strategy: st.SearchStrategy = shapes, bound: float = 1e3) -> st.SearchStrategy:
    return hnp.arrays(dtype, shape_strategy, elements=st.floats(-bound, bound, width=np.dtype(dtype).itemsize * 8))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))


@pytest.mark.parametrize("dtype", FLOATS)
@given(data=st.data())
@settings(max_examples=25, deadline=None)
def test_fp16_relative_error(dtype: type, data: st.DataObject) -> None:
    x = data.draw(floats_array(dtype))
    enc = FP16().encode(x)
    y = decode_tree(enc)
    assert y.dtype == x.dtype and y.shape == x.shape
    x64 = x.astype(np.float64)
    # half precision: 11-bit mantissa (rel 2**-11) or absolute 2**-25 near zero (subnormals)
    assert np.all(np.abs(y.astype(np.float64) - x64) <= np.abs(x64) * 2.0**-11 + 2.0**-24)
    assert enc.nbytes == x.size * 2


def test_fp16_clamps_instead_of_overflowing() -> None:
    x = np.array([1e6, -1e6, 3.0], np.float32)
    y = decode_tree(FP16().encode(x))
    assert y.tolist() == [65504.0, -65504.0, 3.0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fp16_casts_first_and_clamps_only_what_would_overflow_bit_for_bit(dtype: type) -> None:
    """Every chunk is cast first and redone with clamping only if the cast overflowed: the bits
    equal clamping everything first, around the rounding edge 65520 too, in chunks on both paths."""
    rng = np.random.default_rng(8)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)].astype(dtype)
    edge = np.array([65504, 65519.99, 65520, 65535, 1e30, 6.1e-5, 5.96e-8, 2.98e-8, 1e-40, -0.0], dtype)
    x[70_000:70_000 + edge.size] = edge  # second chunk: clamped
    x[140_000:140_003] = -edge[:3]  # third chunk: no value past the edge
    got = FP16().encode(x).parts[0]
    want = np.clip(x, -65504, 65504).astype(np.float16)
    assert isinstance(got, np.ndarray) and np.array_equal(got.view(np.uint16), want.view(np.uint16))
    inf = np.array([np.inf, -np.inf, 1e9, np.nan], np.float32)
    kept = FP16().encode(inf, allow_non_finite=True).parts[0]
    assert isinstance(kept, np.ndarray) and kept[:3].tolist() == [np.inf, -np.inf, 65504] and np.isnan(kept[3])


@given(bits=hnp.arrays(np.uint32, hnp.array_shapes(max_dims=2, max_side=300)))
@settings(max_examples=60, deadline=None)
def test_bf16_fast_cast_is_round_to_nearest_even_bit_for_bit(bits: np.ndarray) -> None:
    """The float32 path (ml_dtypes' cast) gives exactly the bits of the textbook rounding, over
    every float32 bit pattern that is finite and within bf16's range, subnormals included."""
    bits = bits[(bits & 0x7F800000) != 0x7F800000]  # no NaN or Inf
    x = bits.view(np.float32)
    x = x[np.abs(x) <= np.float32(3.3e38)]
    want = ((x.view(np.uint32).astype(np.uint64) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1)) >> 16).astype(np.uint16)
    got = parse_codec("bf16").encode(x).parts[0]
    assert np.array_equal(got.reshape(-1), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@given(data=st.data())
@settings(max_examples=25, deadline=None)
def test_bf16_relative_error(dtype: type, data: st.DataObject) -> None:
    x = data.draw(floats_array(dtype))
    y = decode_tree(parse_codec("bf16").encode(x))
    x64 = x.astype(np.float64)
    # 8-bit mantissa, round to nearest: rel error <= 2**-8 (plus float32 subnormal slack)
    assert np.all(np.abs(y.astype(np.float64) - x64) <= np.abs(x64) * 2.0**-8 + 1e-38)


@pytest.mark.parametrize("block", [0, 8, 64])
@pytest.mark.parametrize("dtype", FLOATS)
@given(data=st.data())
@settings(max_examples=20, deadline=None)
def test_int8_error_within_half_step(block: int, dtype: type, data: st.DataObject) -> None:
    x = data.draw(floats_array(dtype))
    codec = Int8(block=block)
    y = decode_tree(codec.encode(x)).astype(np.float64)
    x64 = x.astype(np.float64)
    if block:
        flat = np.concatenate([x64.reshape(-1), np.zeros(-x.size % block)]).reshape(-1, block)
        amax = np.repeat(np.abs(flat).max(axis=1), block)[: x.size].reshape(x.shape)
    else:
        amax = np.abs(x64).max(axis=-1, keepdims=True)
    # rounding to the nearest of 255 levels: |err| <= max/254, plus float32 scale rounding
    # and the rounding of the result into the output dtype (matters for float16): relative to
    # the value, or half the subnormal spacing below the normal range (hypothesis found
    # [1e-5, 1e-7] in float16: 1.19e-7 decodes to 1.58e-7, which float16 can only hold as 1.79e-7)
    info = np.finfo(dtype)
    out_rounding = (np.abs(x64) + amax / 254) * info.eps + float(info.smallest_subnormal) / 2
    assert np.all(np.abs(y - x64) <= amax / 254 * (1 + 1e-5) + out_rounding + 1e-30)


@given(data=st.data())
@settings(max_examples=25, deadline=None)
def test_svd_error_equals_discarded_energy(data: st.DataObject) -> None:
    x = data.draw(floats_array(np.float64, hnp.array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=20), 100))
    frac = data.draw(st.floats(0.05, 1.0))
    codec = SVD(frac)
    y = decode_tree(codec.encode(x))
    t, h = x.shape[-2:]
    k = codec.rank(t, h)
    s = np.linalg.svd(x.reshape(-1, t, h), compute_uv=False)
    discarded = float(np.sum(s[:, k:] ** 2))
    assert np.isclose(np.sum((y - x) ** 2), discarded, rtol=1e-6, atol=1e-8 * max(1.0, float(np.sum(x**2))))


@pytest.mark.parametrize("frac", [0.1, 0.3, 0.6])
def test_rsvd_close_to_exact_on_decaying_spectrum(frac: float) -> None:
    rng = np.random.default_rng(1)
    u, v = rng.standard_normal((8, 32, 32)), rng.standard_normal((8, 32, 96))
    x = ((u * np.exp(-np.arange(32) / 6)) @ v).astype(np.float32)
    exact = rel_err(x, decode_tree(SVD(frac).encode(x)))
    approx = rel_err(x, decode_tree(RandomizedSVD(frac).encode(x)))
    assert exact <= approx <= exact * 1.1 + 1e-6


def test_rsvd_warm_start_uses_and_updates_state() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 16, 48)).astype(np.float32)
    state = LowRankState()
    codec = RandomizedSVD(0.25, iters=0)
    cold = rel_err(x, decode_tree(codec.encode(x, state=state)))
    assert state.basis is not None and state.warm_starts == 0
    warm = [rel_err(x, decode_tree(codec.encode(x, state=state))) for _ in range(4)]
    assert state.warm_starts == 4
    exact = rel_err(x, decode_tree(SVD(0.25).encode(x)))
    assert warm[-1] <= cold and warm[-1] <= exact * 1.02  # subspace iteration converges


def test_lowrank_1d_is_sent_raw() -> None:
    x = np.arange(10, dtype=np.float32)
    enc = SVD(0.5).encode(x)
    assert enc.codec_id == Identity.wire_id
    assert np.array_equal(decode_tree(enc), x)


@given(x=floats_array(np.float32), frac=st.floats(0.01, 1.0))
@settings(max_examples=40, deadline=None)
def test_topk_keeps_largest_exactly(x: np.ndarray, frac: float) -> None:
    codec = TopK(frac)
    y = decode_tree(codec.encode(x))
    k = codec.count(x.size)
    assert np.count_nonzero(y != x) <= x.size - k  # kept values are exact
    kept = np.abs(x[y != 0]) if np.any(y != 0) else np.array([np.inf])
    dropped = np.abs(x[(y == 0) & (x != 0)])
    if dropped.size:
        assert dropped.max() <= kept.min()


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.bool_, np.float32, np.float16])
@given(data=st.data())
@settings(max_examples=15, deadline=None)
def test_lz4_bit_exact(dtype: type, data: st.DataObject) -> None:
    x = data.draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, max_side=40),
                             elements=None if np.dtype(dtype).kind != "f" else st.floats(-1e3, 1e3, width=np.dtype(dtype).itemsize * 8)))
    y = decode_tree(LZ4().encode(x))
    assert y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes()


CHAINS = ["none", "fp16", "bf16", "int8", "int8(block=32)", "svd(0.6)", "rsvd(0.5)", "powersgd(0.5)", "topk(0.1)",
          "lz4", "fp16(svd(0.6))", "fp16(powersgd(0.6))", "int8(svd(0.5))", "fp16(rsvd(0.3))", "lz4(topk(0.2))", "fp16(topk(0.2))",
          "lz4(fp16(svd(0.4)))", "size(1000, small=lz4, large=fp16(svd(0.6)))"]


@pytest.mark.parametrize("spec", CHAINS)
@given(x=floats_array(np.float32, hnp.array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=24), 100))
@settings(max_examples=10, deadline=None)
def test_chain_roundtrip_and_ratio_estimate(spec: str, x: np.ndarray) -> None:
    codec = parse_codec(spec)
    assert parse_codec(codec.spec).spec == codec.spec  # spec strings round-trip
    enc = codec.encode(x)
    y = decode_tree(enc)
    assert y.shape == x.shape and y.dtype == x.dtype
    est, real = codec.estimated_ratio(x.shape, x.dtype), enc.nbytes / x.nbytes
    if "lz4" in spec:  # data dependent: the estimate is an upper bound (lz4 overhead <= 0.4% + 16 B)
        assert real <= est * 1.005 + 16 / x.nbytes + 1e-9
    else:
        assert real == pytest.approx(est, rel=1e-9)


def test_chain_composition_is_inner_then_outer() -> None:
    x = np.random.default_rng(3).standard_normal((4, 32, 64)).astype(np.float32)
    enc = parse_codec("fp16(svd(0.6))").encode(x)
    assert enc.codec_id == SVD.wire_id
    assert [p.codec_id for p in enc.parts] == [FP16.wire_id, FP16.wire_id]
    plain = decode_tree(SVD(0.6).encode(x))
    assert rel_err(plain, decode_tree(enc)) < 2e-3  # fp16 on the factors adds ~1e-3


def test_paper_ratio_fp16_svd06_for_64_token_sequences() -> None:
    ratio = parse_codec("fp16(svd(0.6))").estimated_ratio((32, 64, 768), np.float32)
    assert 0.30 <= ratio <= 0.33  # paper Table 5: 0.30


def test_non_finite_refused_by_default_and_allowed_on_request() -> None:
    x = np.array([[1.0, np.nan], [np.inf, 2.0]], np.float32)
    for spec in ["none", "fp16", "bf16", "int8", "svd(0.5)", "lz4", "topk(0.5)"]:
        with pytest.raises(NonFiniteTensor):
            parse_codec(spec).encode(x)
    for spec in ["none", "fp16", "bf16", "lz4"]:
        y = decode_tree(parse_codec(spec).encode(x, allow_non_finite=True))
        assert np.isnan(y[0, 1]) and np.isposinf(y[1, 0]) and y[0, 0] == 1.0
    with pytest.raises(NonFiniteTensor):  # int8 cannot represent them at all
        Int8().encode(x, allow_non_finite=True)


def test_role_and_schedule_pick_codecs() -> None:
    role = parse_codec("role(activation=fp16(svd(0.6)), gradient=int8, ids=lz4)")
    x = np.ones((4, 8, 16), np.float32)
    assert role.encode(x, role="gradient").codec_id == Int8.wire_id
    assert role.encode(np.arange(5), role="ids").codec_id == LZ4.wire_id
    assert role.encode(x).codec_id == Identity.wire_id  # unknown role -> default
    sched = CompressionSchedule.parse("fp16", compress_from_step=100)
    assert sched.codec_for(99).spec == "none" and sched.codec_for(100).spec == "fp16"


@pytest.mark.parametrize("bad, err, token", [
    ("fp17(svd(0.6))", UnknownCodec, "fp17"), ("svd(1.5)", CodecError, "1.5"),
    ("fp16(svd(0.6)", CodecError, "end of string"), ("svd(0.6))", CodecError, "')'"),
    ("int8(blk=3)", CodecError, "blk"), ("svd", CodecError, "fraction"), ("fp16($)", CodecError, "'$'"),
    ("", CodecError, "non-empty"), ("rsvd(0.5, iters=-1)", CodecError, "iters"),
])
def test_parser_errors_name_the_bad_token(bad: str, err: type, token: str) -> None:
    with pytest.raises(err, match=None) as info:
        parse_codec(bad)
    assert token in str(info.value)


def test_registry_rejects_duplicate_wire_ids() -> None:
    with pytest.raises(TypeError, match="already used"):
        class Clash(Codec):  # noqa: F841 - the class statement itself must fail
            wire_id = FP16.wire_id
            name = "clash"
    assert {c.name for c in registered().values()} >= {"none", "fp16", "bf16", "int8", "svd", "rsvd", "powersgd", "topk", "lz4"}


def test_decode_validates_instead_of_returning_garbage() -> None:
    x = np.ones((2, 8, 8), np.float32)
    enc = SVD(0.5).encode(x)
    bad_shape = Encoded(enc.codec_id, enc.params, (2, 8, 9), enc.dtype, enc.parts)
    with pytest.raises(ShapeMismatch):
        decode_tree(bad_shape)
    with pytest.raises(CodecError):
        decode_tree(Encoded(enc.codec_id, {"fraction": 7.0}, enc.shape, enc.dtype, enc.parts))
    with pytest.raises(UnknownCodec):
        decode_tree(Encoded(99, {}, enc.shape, enc.dtype, enc.parts))
    q = Int8().encode(x)
    with pytest.raises(CodecError):
        decode_tree(Encoded(q.codec_id, q.params, q.shape, q.dtype, (q.parts[0], -np.ones(16, np.float32))))
    t = TopK(0.5).encode(np.arange(8, dtype=np.float32))
    with pytest.raises(CodecError):
        decode_tree(Encoded(t.codec_id, t.params, t.shape, t.dtype, (t.parts[0], t.parts[1] + 100)))
    with pytest.raises(CodecError):
        decode_tree(Encoded(LZ4.wire_id, {}, (4,), "int64", (np.frombuffer(b"\xff" * 8, np.uint8),)))
    with pytest.raises(CodecError):  # hostile shape must not allocate
        decode_tree(Encoded(LZ4.wire_id, {}, (2**40,), "float64", (np.zeros(4, np.uint8),)))


# --------------------------------------------------------------------------- hardening regressions


@pytest.mark.parametrize("spec", ["none", "lz4"])
def test_big_endian_input_decodes_to_the_same_values(spec: str) -> None:
    x = np.array([1, 2, 3], ">i4")
    y = decode_tree(parse_codec(spec).encode(x))
    assert y.tolist() == [1, 2, 3] and y.dtype == np.int32


def test_bf16_clamps_float64_beyond_float32_range_instead_of_inf() -> None:
    y = decode_tree(parse_codec("bf16").encode(np.array([1e39, -1e300, 2.0])))
    bf16_max = float(np.array([0x7F7F0000], np.uint32).view(np.float32)[0])  # largest finite bf16
    assert y.tolist() == [bf16_max, -bf16_max, 2.0]


def test_bf16_saturates_float16_max_instead_of_inf() -> None:
    y = decode_tree(parse_codec("bf16").encode(np.array([65504.0, -65504.0], np.float16)))
    assert y.tolist() == [65504.0, -65504.0]  # bf16 rounds them to +-65536


def test_bf16_nan_scalar_with_allow_non_finite() -> None:
    y = decode_tree(parse_codec("bf16").encode(np.array(np.nan, np.float32), allow_non_finite=True))
    assert y.shape == () and np.isnan(y)


@pytest.mark.parametrize("magnitude", [1e19, 1e30, 1e-30, 1e-40])
@pytest.mark.parametrize("spec", ["svd(0.5)", "rsvd(0.5)", "powersgd(0.5)"])
def test_lowrank_factors_float32_of_extreme_magnitude(spec: str, magnitude: float) -> None:
    rng = np.random.default_rng(4)
    base = (rng.standard_normal((3, 16, 4)) @ rng.standard_normal((3, 4, 24))).astype(np.float32)  # rank 4
    x = (base.astype(np.float64) * magnitude).astype(np.float32)
    y = decode_tree(parse_codec(spec).encode(x))
    assert np.isfinite(y).all()
    # rank 4 < k = 8: both reconstruct it (subnormal inputs lose their last bits)
    assert rel_err(x, y) < (1e-2 if magnitude < 1e-38 else 1e-4)


@pytest.mark.parametrize("spec", ["svd(0.5)", "rsvd(0.5)", "powersgd(0.5)", "fp16(svd(0.5))"])
def test_lowrank_refuses_values_whose_factors_would_overflow(spec: str) -> None:
    x = np.full((4, 8), 3e38, np.float32)
    with pytest.raises(CodecError, match="too large"):
        parse_codec(spec).encode(x)


def test_int4_packs_two_levels_a_byte_and_keeps_the_sign_and_the_block_maximum() -> None:
    x = np.array([7.0, -7.0, 3.0, -0.4, 0.0, 1.0, 2.0, 6.6, 0.5, -0.5], np.float32)  # a full and a tail block
    enc = Int4(block=8).encode(x)
    packed, scale = enc.parts
    assert packed.dtype == np.uint8 and packed.shape == (8,) and scale.tolist() == [1.0, np.float32(0.5) / np.float32(7)]
    assert int(packed[0]) == (7 + 8) | ((-7 + 8) << 4)  # the first value of a pair in the low nibble
    y = decode_tree(enc)
    assert y[:8].tolist() == [7.0, -7.0, 3.0, -0.0, 0.0, 1.0, 2.0, 7.0]
    assert np.allclose(y[8:], [0.5, -0.5])
    assert Int4().estimated_ratio((64, 384), "float32") == pytest.approx(0.15625)
    with pytest.raises(CodecError, match="even"):
        Int4(block=33)


def test_int8_refuses_float64_beyond_float32_range() -> None:
    with pytest.raises(CodecError, match="float32 range"):
        Int8().encode(np.array([[1e300, 1.0]]))


@pytest.mark.parametrize("block", [0, 8])
def test_int8_roundtrips_float32_max(block: int) -> None:
    big = float(np.finfo(np.float32).max)
    x = np.array([[big, -big, 1.0]], np.float32)
    y = decode_tree(Int8(block=block).encode(x))
    assert np.isfinite(y).all() and abs(float(y[0, 0]) - big) <= big / 254


BAD_NODES = {
    "parts is None": Encoded(FP16.wire_id, {}, (2,), "float32", None),  # type: ignore[arg-type]
    "params is None": Encoded(FP16.wire_id, None, (2,), "float32", ()),  # type: ignore[arg-type]
    "params is a list": Encoded(FP16.wire_id, [("a", 1)], (2,), "float32", ()),  # type: ignore[arg-type]
    "shape is None": Encoded(FP16.wire_id, {}, None, "float32", ()),  # type: ignore[arg-type]
    "shape is an int": Encoded(FP16.wire_id, {}, 2, "float32", ()),  # type: ignore[arg-type]
    "dtype is None": Encoded(FP16.wire_id, {}, (2,), None, ()),  # type: ignore[arg-type]
    "codec id is a name": Encoded("fp16", {}, (2,), "float32", (np.zeros(2, np.float16),)),  # type: ignore[arg-type]
    "part is a list": Encoded(Identity.wire_id, {}, (2,), "float32", ([1.0, 2.0],)),
    "part is big-endian": Encoded(Identity.wire_id, {}, (2,), "float32", (np.zeros(2, ">f4"),)),
    "part is complex": Encoded(Identity.wire_id, {}, (2,), "float32", (np.zeros(2, np.complex64),)),
    "fp16 claims int32": Encoded(FP16.wire_id, {}, (2,), "int32", (np.array([np.inf, 1], np.float16),)),
    "int8 claims int64": Encoded(Int8.wire_id, {"block": 0}, (1, 2), "int64",
                                 (np.ones((1, 2), np.int8), np.ones(1, np.float32))),
    "int4 scale is NaN": Encoded(Int4.wire_id, {"block": 8}, (8,), "float32",
                                 (np.full(4, 0x99, np.uint8), np.array([np.nan], np.float32))),
    "int4 scale is beyond 7 steps": Encoded(Int4.wire_id, {"block": 8}, (8,), "float32",
                                            (np.full(4, 0xFF, np.uint8), np.array([3e38], np.float32))),
    "int4 nibble 0 (level -8)": Encoded(Int4.wire_id, {"block": 8}, (8,), "float32",
                                        (np.full(4, 0x80, np.uint8), np.ones(1, np.float32))),
    "int4 packs too few bytes": Encoded(Int4.wire_id, {"block": 8}, (8,), "float32",
                                        (np.zeros(3, np.uint8), np.ones(1, np.float32))),
    "int4 odd block": Encoded(Int4.wire_id, {"block": 9}, (9,), "float32",
                              (np.zeros(5, np.uint8), np.ones(1, np.float32))),
    "topk claims int16": Encoded(TopK.wire_id, {"fraction": 1.0}, (2,), "int16",
                                 (np.ones(2, np.int16), np.arange(2, dtype=np.int32))),
}


@pytest.mark.parametrize("name", sorted(BAD_NODES))
def test_decode_tree_refuses_malformed_nodes_with_codec_errors(name: str) -> None:
    assert_decode_refused(BAD_NODES[name])


def test_decode_tree_caps_every_node_of_the_tree_together() -> None:
    x = np.random.default_rng(5).standard_normal((4, 32, 64)).astype(np.float32)
    enc = parse_codec("fp16(svd(0.5))").encode(x)
    factors = sum(int(np.prod(p.shape)) * 4 for p in enc.parts)  # each fp16 node decodes to float32
    with pytest.raises(DecodedTooLarge):  # the float32 factors are materialised too
        decode_tree(enc, max_decoded_bytes=x.nbytes)
    assert decode_tree(enc, max_decoded_bytes=x.nbytes + factors).shape == x.shape


# ---------------------------------------------------------------- powersgd


def _drifting_stream(steps: int, seed: int = 5) -> list[np.ndarray]:
    """[4, 32, 96] matrices with a decaying spectrum that change a little from one message to the next."""
    rng = np.random.default_rng(seed)
    u, v = rng.standard_normal((4, 32, 32)), rng.standard_normal((4, 32, 96))
    x = (u * np.exp(-np.arange(32) / 6)) @ v
    out = []
    for _ in range(steps):
        out.append(x.astype(np.float32))
        x = x + 0.05 * rng.standard_normal(x.shape)
    return out


def _powersgd_reference(stream: list[np.ndarray], k: int, seed: int = 0) -> list[float]:
    """PowerSGD's math (torch's powerSGD_hook: P = M Q, orthogonalise P, Q = M^T P) in float64 numpy,
    from the Gaussian sketch the codec starts from: the relative error of each message."""
    h = stream[0].shape[-1]
    q = np.random.default_rng(seed).standard_normal((h, k), dtype=np.float32).astype(np.float64)
    errs = []
    for x in stream:
        m = x.astype(np.float64)
        p = np.linalg.qr(m @ q)[0]
        q = m.transpose(0, 2, 1) @ p
        errs.append(rel_err(m, p @ q.transpose(0, 2, 1)))
    return errs


def test_powersgd_warm_error_is_at_most_powersgd_math_on_a_drifting_stream() -> None:
    stream = _drifting_stream(8)
    codec, state = parse_codec("powersgd(0.25)"), LowRankState()
    ours = [rel_err(x, decode_tree(codec.encode(x, state=state))) for x in stream]
    assert state.warm_starts == len(stream) - 1
    reference = _powersgd_reference(stream, codec.rank(32, 96))  # type: ignore[attr-defined]
    for got, want in zip(ours, reference):
        assert got <= want * (1 + 1e-4) + 1e-6  # the same math, float32 against float64
    cold = rel_err(stream[-1], decode_tree(codec.encode(stream[-1])))
    exact = rel_err(stream[-1], decode_tree(SVD(0.25).encode(stream[-1])))
    assert ours[-1] < cold and ours[-1] <= exact * 1.05  # the warm start tracks the dominant subspace


def test_powersgd_ships_an_orthonormal_left_factor_and_remembers_the_right_one() -> None:
    x = _drifting_stream(1)[0]
    state = LowRankState()
    enc = parse_codec("powersgd(0.25)").encode(x, state=state)
    left, right = enc.parts
    assert isinstance(left, np.ndarray) and isinstance(right, np.ndarray)
    assert left.shape == (4, 32, 8) and right.shape == (4, 8, 96)
    np.testing.assert_allclose(left.transpose(0, 2, 1) @ left, np.broadcast_to(np.eye(8), (4, 8, 8)), atol=1e-5)
    assert state.basis is not None and np.array_equal(state.basis, right)


@pytest.mark.parametrize("shape", [(3, 16, 24), (2, 24, 8), (1, 5, 5)])
def test_powersgd_zero_and_rank_deficient_matrices_stay_finite(shape: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(6)
    b, t, h = shape
    rank2 = (rng.standard_normal((b, t, 2)) @ rng.standard_normal((b, 2, h))).astype(np.float32)
    codec, state = parse_codec("powersgd(0.5)"), LowRankState()
    for x in [np.zeros(shape, np.float32), np.zeros(shape, np.float32), rank2, rank2, np.zeros(shape, np.float32)]:
        enc = codec.encode(x, state=state)
        assert all(np.isfinite(p).all() for p in enc.leaves())
        y = decode_tree(enc)
        assert np.isfinite(y).all()
        if not x.any():
            assert not y.any()
        else:  # rank 2 < k: captured whole, even right after a zero basis
            assert rel_err(x, y) < 1e-5
    assert state.warm_starts == 4


def test_powersgd_rescales_extreme_magnitudes_and_remembers_a_basis_in_range() -> None:
    stream = _drifting_stream(3)

    def errors(scale: float) -> list[float]:
        state, out = LowRankState(), []
        for x in stream:
            xs = (x.astype(np.float64) * scale).astype(np.float32)
            y = decode_tree(parse_codec("powersgd(0.25)").encode(xs, state=state))
            assert np.isfinite(y).all()
            assert state.basis is not None and float(np.abs(state.basis).max()) < 1e4  # rescaled units
            out.append(rel_err(xs, y))
        return out

    plain = errors(1.0)
    for scale in (1e30, 1e-30):
        np.testing.assert_allclose(errors(scale), plain, rtol=1e-3)


def test_powersgd_refuses_values_whose_right_factor_could_overflow_in_tall_matrices() -> None:
    # t = 400 > h = 4: a column of right = P^T x can reach sqrt(400) max|x| (svd's limit uses sqrt(h))
    x = np.full((400, 4), 2e37, np.float32)
    with pytest.raises(CodecError, match="too large"):
        parse_codec("powersgd(0.5)").encode(x)
    parse_codec("svd(0.5)").encode(x)  # fine for svd: its left rows have 4 values


def test_powersgd_in_chains_and_parser() -> None:
    codec = parse_codec("fp16(powersgd(0.6, seed=3))")
    assert codec.spec == "fp16(powersgd(0.6, seed=3))" and parse_codec(codec.spec).spec == codec.spec
    with pytest.raises(CodecError, match="seed"):
        parse_codec("powersgd(0.5, seed=-1)")
    with pytest.raises(CodecError, match="fraction"):
        parse_codec("powersgd(1.5)")
    x = _drifting_stream(1)[0]
    assert rel_err(x, decode_tree(codec.encode(x))) < 0.2
