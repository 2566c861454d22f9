"""Fuzz the envelope decoder: every hostile input must raise a WireError subclass, and decoding
an accepted one must never materialise more than the per-envelope cap.

Inputs: random bytes, truncations and bit flips of valid envelopes (with the checksum
recomputed half of the time so the header parser itself is reached), hostile header
fields, random codec trees over random payloads (canonical layouts and overlapping,
unaligned or trailing ones), and decompression bombs (nested lz4, tensors sharing one
payload). The CI test runs ~10,000 inputs in a few seconds; the ``slow`` one also measures
the decoder's allocations with tracemalloc, on ~30,000 inputs in CI and on
``NEBULA_FUZZ_SCALE`` x 10,000 when set (``NEBULA_FUZZ_SCALE=10``: >= 100,000, about a minute).
"""

from __future__ import annotations

import functools
import os
import struct
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import lz4.block
import numpy as np
import pytest

from nebula_mq.codecs import parse_codec
from nebula_mq.codecs.base import WIRE_DTYPES
from nebula_mq.errors import WireError
from nebula_mq.wire import Envelope, decode_envelope, encode_envelope, pack_tensors, unpack_tensors
from nebula_mq.wire.envelope import _HEAD, _PREFIX
from tests.fixtures.frames import GOOD_HEADER, header_region, reframe, region_of, tensor_frame

MAX = 1 << 22
CAP = 1 << 20  # decoded bytes per envelope in these tests
SLACK = 1 << 16  # Python objects a decode may create besides arrays (msgpack header, records)
DTYPES = sorted(WIRE_DTYPES)
DIMS = [0, 1, 2, 3, 5, 8, 64, 1 << 10, 1 << 16, 1 << 20, 1 << 40]
PARAMS = [{}, {"fraction": 0.5}, {"fraction": 1.0}, {"block": 8}, {"block": 0}, {"fraction": 0.1, "iters": 0},
          {"fraction": 7.0}, {"block": 3}, {"x": 1}]


def _valid() -> list[bytes]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 16)).astype(np.float32)
    out = []
    for spec in ["none", "fp16(svd(0.5))", "int8", "lz4(topk(0.3))"]:
        recs = pack_tensors({"x": x, "ids": np.arange(6)}, {"x": parse_codec(spec), "ids": parse_codec("lz4")})
        out.append(encode_envelope(Envelope("j", "f", 1, 0, 2, "p", recs, {"a": 1}), signer=lambda c: b"t" * 16))
    return out


def _hostile_headers(rng: np.random.Generator) -> list[bytes]:
    wrong_values = [None, -1, 2**64 - 1, 1.5, "x", b"b", [], {}, [[]], True, "x" * 300]
    out = [reframe(header_region({**GOOD_HEADER, key: v})) for key in GOOD_HEADER for v in wrong_values]
    trees = [
        [1, {}, [4], "float32", [["float16", [4], 0, 8]]],  # points past the blob
        [1, {}, [2**40], "float32", [["float16", [2**40], 0, 2**41]]],  # huge declared shape
        [0, {}, [4], "object", [["object", [4], 0, 32]]],  # forbidden dtype
        [99, {}, [4], "float32", [["float32", [4], 0, 16]]],  # unknown codec
        [4, {"fraction": 9.0}, [2, 2], "float32", [["float32", [2, 1], 0, 8], ["float32", [1, 2], 8, 8]]],
        [4, {"fraction": 0.5}, [2, 2], "float32", [["float32", [2, 1], 0, 8]]],  # missing part
        [7, {}, [1000], "int64", [["uint8", [16], 0, 16]]],  # corrupt lz4
        [3, {"block": 3}, [4], "float32", [["int8", [4], 0, 4], ["float32", [1], 8, 4]]],
        [1, {}, [4], "float32", [["float16", [4], -8, 8]]],
        [1, {"x": [1]}, [4], "float32", []],
        [1, {}, [2], "int32", [["float16", [2], 0, 4]]],  # fp16 node claiming an integer output
    ]
    nested = [0, {}, [1], "float32", [["float32", [1], 0, 4]]]
    for _ in range(20):
        nested = [1, {}, [1], "float32", [nested]]
    trees.append(nested)
    out += [tensor_frame([["x", tree[2], tree[3], "spec", tree]], bytes(64)) for tree in trees]
    for _ in range(200):  # random msgpack-ish garbage with a valid frame
        junk = rng.integers(0, 256, int(rng.integers(0, 64)), dtype=np.uint8).tobytes()
        out.append(reframe(_HEAD.pack(1, 0, len(junk)) + junk + bytes(-len(junk) % 8)))
    out.append(reframe(_HEAD.pack(1, 0, 2**31) + b"\x00" * 8))  # huge header length
    out.append(reframe(_HEAD.pack(1, 0, 6) + b"\xdb\xff\xff\xff\xff" + b"a" + bytes(2)))  # str32 of 4 GiB
    out.append(reframe(_HEAD.pack(1, 0, 5) + b"\xdd\xff\xff\xff\xff" + bytes(3)))  # array32 of 4G items
    out.append(reframe(_HEAD.pack(1, 0, 3) + b"\x91" * 3 + bytes(5)))
    out.append(reframe(_HEAD.pack(1, 0, 600) + b"\x91" * 600))  # deep nesting
    return out


@functools.cache
def _zeros_lz4(levels: int, n: int) -> bytes:
    """``n`` zero bytes lz4-compressed ``levels`` times: a few hundred bytes for 2**26."""
    data = bytes(n)
    for _ in range(levels):
        data = lz4.block.compress(data, store_size=False)
    return data


def _bombs(rng: np.random.Generator, count: int) -> list[bytes]:
    """Frames that decode to far more than their size: nested lz4 and tensors sharing a payload."""
    out = []
    for _ in range(count):
        levels, n = int(rng.integers(1, 4)), 1 << int(rng.integers(18, 27))
        payload = _zeros_lz4(levels, n)
        sizes = [n] + [len(_zeros_lz4(k, n)) for k in range(1, levels)]  # sizes[k]: decoded size of level k
        node: list[Any] = ["uint8", [len(payload)], 0, len(payload)]
        for k in range(levels - 1, -1, -1):
            node = [7, {}, [sizes[k]], "uint8", [node]]
        copies = int(rng.integers(1, 8))  # several tensors pointing at offset 0 of the one payload
        records = [[f"t{i}", [n], "uint8", "lz4", node] for i in range(copies)]
        out.append(tensor_frame(records, payload + bytes(-len(payload) % 8)))
    return out


def _random_node(rng: np.random.Generator, blob: bytearray, depth: int) -> list[Any]:
    """A random codec node; its array parts are appended to ``blob`` (mostly at the canonical offset)."""
    codec_id = int(rng.integers(0, 8)) if rng.random() < 0.95 else int(rng.integers(0, 128))
    shape = [DIMS[int(rng.integers(0, 6 if rng.random() < 0.8 else len(DIMS)))] for _ in range(int(rng.integers(0, 4)))]
    parts = []
    for _ in range(int(rng.integers(0, 4))):
        if depth < 3 and rng.random() < 0.2:
            parts.append(_random_node(rng, blob, depth + 1))
            continue
        dtype = np.dtype(DTYPES[int(rng.integers(len(DTYPES)))])
        pshape = [DIMS[int(rng.integers(0, 6))] for _ in range(int(rng.integers(0, 3)))]
        nbytes = int(np.prod(pshape, dtype=np.int64)) * dtype.itemsize
        offset = len(blob)
        if rng.random() < 0.1:  # overlapping, unaligned or gapped
            offset = max(0, offset + int(rng.choice([-8, -4, 1, 4, 8])))
        data = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes() if rng.random() < 0.5 else bytes(nbytes)
        blob.extend(data + bytes(-nbytes % 8))
        parts.append([dtype.name, pshape, offset, nbytes])
    dtype_name = DTYPES[int(rng.integers(len(DTYPES)))] if rng.random() < 0.3 else "float32"
    return [codec_id, PARAMS[int(rng.integers(len(PARAMS)))], shape, dtype_name, parts]


def _random_trees(rng: np.random.Generator, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        blob = bytearray()
        records = []
        for i in range(int(rng.integers(1, 4))):
            tree = _random_node(rng, blob, 0)
            records.append([f"t{i}", tree[2], tree[3], "spec", tree])
        if rng.random() < 0.05:
            blob.extend(bytes(8))  # trailing bytes
        out.append(tensor_frame(records, bytes(blob)))
    return out


@dataclass
class Cases:
    frames: list[bytes] = field(default_factory=list)
    must_fail: set[int] = field(default_factory=set)  # never accepted (flips outside the tag)
    never_decode: set[int] = field(default_factory=set)  # random bytes and truncations


def fuzz_cases(seed: int, scale: int) -> Cases:
    """About ``scale`` * 10,000 inputs."""
    rng = np.random.default_rng(seed)
    valid = _valid()
    cases = Cases(_hostile_headers(rng))
    for _ in range(1500 * scale):
        cases.never_decode.add(len(cases.frames))
        cases.frames.append(rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8).tobytes())
    for _ in range(1500 * scale):
        v = valid[int(rng.integers(len(valid)))]
        cases.never_decode.add(len(cases.frames))
        cases.frames.append(v[: int(rng.integers(0, len(v)))])
    for i in range(3500 * scale):
        v = bytearray(valid[int(rng.integers(len(valid)))])
        # distinct positions: two flips of the same bit would restore the valid frame
        flipped = [int(p) for p in rng.choice(len(v), size=int(rng.integers(1, 4)), replace=False)]
        for pos in flipped:
            v[pos] ^= 1 << int(rng.integers(8))
        # Half the flips get a recomputed checksum so they reach the header/tree/codec
        # validation (flipped payload bits then legitimately decode to other values);
        # the other half must all fail unless they only touched the tag (the HMAC's job).
        if i % 2:
            cases.frames.append(reframe(region_of(bytes(v))))
        else:
            if any(not _PREFIX.size <= p < _PREFIX.size + 16 for p in flipped):
                cases.must_fail.add(len(cases.frames))
            cases.frames.append(bytes(v))
    for version in (0, 2, 65535):
        region = bytearray(region_of(valid[0]))
        struct.pack_into("<H", region, 0, version)
        cases.frames.append(reframe(bytes(region)))
    cases.frames += _random_trees(rng, 3400 * scale)
    cases.frames += _bombs(rng, 150 * scale)
    return cases


@dataclass
class Outcome:
    accepted: list[int] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)
    escaped: list[tuple[int, str]] = field(default_factory=list)  # (case, exception) not WireError
    max_decoded: int = 0  # largest sum of decoded arrays' nbytes of one envelope
    max_traced: int = 0  # largest tracemalloc peak above the baseline of one decode


def run(cases: Cases, *, traced: bool = False) -> Outcome:
    out = Outcome()
    for i, data in enumerate(cases.frames):
        if traced:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        try:
            env = decode_envelope(data, max_bytes=MAX)
            tensors = unpack_tensors(env, max_decoded_bytes=CAP)  # as runtime/channel.py calls it
            out.max_decoded = max(out.max_decoded, sum(a.nbytes for a in tensors.values()))
            out.accepted.append(i)
        except WireError as exc:
            out.refusals[type(exc).__name__] += 1
        except Exception as exc:  # noqa: BLE001 - this is what the test counts
            out.escaped.append((i, repr(exc)))
        if traced:
            out.max_traced = max(out.max_traced, tracemalloc.get_traced_memory()[1] - base)
        tensors = env = None  # type: ignore[assignment]  # free before the next case's baseline
    return out


def check(cases: Cases, out: Outcome) -> None:
    assert out.escaped == [], f"{len(out.escaped)} untyped exceptions, first: {out.escaped[:3]}"
    accepted = set(out.accepted)
    assert not cases.must_fail & accepted and not cases.never_decode & accepted
    assert out.max_decoded <= CAP
    # the fuzzer reached every layer: the cap, layout checks, codec validation, and real decodes
    assert out.refusals["DecodedTooLarge"] and out.refusals["MalformedMessage"] and out.refusals["CodecError"]
    count = len(cases.frames)
    assert len(cases.must_fail) > count // 10 and len(accepted) < count // 4


def test_fuzz_decoder_only_raises_wire_errors() -> None:
    cases = fuzz_cases(seed=1234, scale=1)
    count = len(cases.frames)
    assert count >= 10_000
    start = time.perf_counter()
    out = run(cases)
    assert time.perf_counter() - start < 30
    check(cases, out)


@pytest.mark.slow
def test_fuzz_with_allocations_traced() -> None:
    """``NEBULA_FUZZ_SCALE=10 pytest tests/unit/wire/test_wire_fuzz.py``: >= 100,000 inputs,
    allocations measured; CI runs scale 3 (>= 30,000 inputs)."""
    scale = int(os.environ.get("NEBULA_FUZZ_SCALE", "3"))
    cases = fuzz_cases(seed=20240613, scale=scale)
    count = len(cases.frames)
    assert count >= scale * 10_000
    tracemalloc.start()
    try:
        start = time.perf_counter()
        out = run(cases, traced=True)
        elapsed = time.perf_counter() - start
    finally:
        tracemalloc.stop()
    check(cases, out)
    assert out.max_traced <= CAP + SLACK, f"a decode allocated {out.max_traced} bytes"
    print(f"\n{count} inputs in {elapsed:.1f} s: {len(out.accepted)} accepted, "
          f"refused {dict(out.refusals)}, max decoded {out.max_decoded} B, max traced {out.max_traced} B")
