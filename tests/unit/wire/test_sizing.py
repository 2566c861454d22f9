"""Size estimates from shapes alone (``nebula_mq.wire.limits``): exact for every registered
codec but lz4 (a bound), and the codecs named as fitting really fit, at the largest fraction."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq.codecs import parse_codec, registered
from nebula_mq.wire.limits import FRACTIONS, Fit, fitting_codecs, payload_bytes, total_bytes
from nebula_mq.wire.tree import ALIGN

SHAPES = st.lists(st.integers(1, 48), min_size=1, max_size=3).map(tuple)
SPECS = ["none", "fp16", "bf16", "int8", "int8(block=16)", "int4", "int3", "int2(block=16)", "hadamard(block=16)",
         "int4(hadamard(32))", "svd(0.5)", "rsvd(0.3)", "powersgd(0.2)", "topk(0.1)"]


def _wire_bytes(spec: str, x: np.ndarray) -> int:
    leaves = parse_codec(spec).encode(x).leaves()
    return sum(-(-int(a.nbytes) // ALIGN) * ALIGN for a in leaves)


@settings(max_examples=40, deadline=None)
@given(shape=SHAPES, spec=st.sampled_from(SPECS), seed=st.integers(0, 2**16))
def test_the_estimate_is_what_the_codec_encodes_to(shape: tuple[int, ...], spec: str, seed: int) -> None:
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    assert payload_bytes(parse_codec(spec), shape, "float32") == _wire_bytes(spec, x)


@settings(max_examples=20, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 2**16))
def test_lz4_is_estimated_raw_and_ids_stay_raw(shape: tuple[int, ...], seed: int) -> None:
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    raw = payload_bytes(parse_codec("none"), shape, "float32")
    assert payload_bytes(parse_codec("lz4"), shape, "float32") == raw  # so "none" is named, never lz4
    assert _wire_bytes("lz4", x) <= raw * 1.004 + 16 + ALIGN  # lz4's worst case on noise
    # A codec that does not take integers (int8 of int64 ids) counts them raw.
    assert payload_bytes(parse_codec("int8"), shape, "int64") == -(-8 * int(np.prod(shape)) // 8) * 8


@settings(max_examples=60, deadline=None)
@given(shapes=st.lists(SHAPES, min_size=1, max_size=3), budget=st.integers(0, 40_000))
def test_the_codecs_named_fit_and_none_larger_would(shapes: list[tuple[int, ...]], budget: int) -> None:
    tensors = [(s, "float32") for s in shapes]
    fits = fitting_codecs(tensors, budget)
    assert len(fits) <= 2
    for fit in fits:
        assert fit.nbytes == total_bytes(parse_codec(fit.spec), tensors) <= budget
    parameterless = [cls() for cls in registered().values() if not _has_required(cls)]
    raw = total_bytes(parse_codec("none"), tensors)
    sizes = [total_bytes(c, tensors) for c in parameterless if total_bytes(c, tensors) < raw or c.name == "none"]
    fitting = [size for size in sizes if size <= budget]
    fixed = [f for f in fits if f.rank is None and "(" not in f.spec]
    assert [f.nbytes for f in fixed] == ([max(fitting)] if fitting else [])
    low_rank = [f for f in fits if f not in fixed]
    for fit in low_rank:  # the largest fraction that fits: the next one up does not
        fraction = float(fit.spec.split("(")[1].rstrip(")"))
        larger = [f for f in FRACTIONS if f > fraction]
        if larger:
            name = fit.spec.split("(")[0]
            assert total_bytes(parse_codec(f"{name}({min(larger)})"), tensors) > budget


def _has_required(cls: type) -> bool:
    import dataclasses

    return any(f.default is dataclasses.MISSING for f in dataclasses.fields(cls))


def test_a_large_activation_is_told_fp16_or_the_largest_rsvd_rank_that_fits() -> None:
    tensors = [((35, 1024, 1024), "float32")]  # 146.8 MB raw
    fits = fitting_codecs(tensors, 96 * 2**20)
    assert fits == [Fit("fp16", 35 * 2**21), Fit("rsvd(0.3)", 35 * 2 * 1024 * 307 * 4, 307)]
    assert fitting_codecs(tensors, 2**20) == [Fit("rsvd(0.003)", 35 * 2 * 1024 * 3 * 4, 3)]
    assert fitting_codecs(tensors, 1000) == []


def test_a_rotation_is_never_named_as_a_fix() -> None:
    """hadamard only rotates (and pads to whole blocks): it never makes a message smaller."""
    for tensors in ([((100,), "float32")], [((64, 384), "float16")], [((2, 128), "float32")]):
        raw = total_bytes(parse_codec("none"), tensors)
        assert total_bytes(parse_codec("hadamard"), tensors) >= raw
        for budget in (raw - 1, raw, 4 * raw):
            assert all(not f.spec.startswith("hadamard") for f in fitting_codecs(tensors, budget))
    assert fitting_codecs([((100,), "float32")], 10_000)[0].spec == "none"
