"""Fuzz the envelope decoder: >= 10,000 hostile inputs, each must raise a WireError subclass.

Inputs: random bytes, truncations and bit flips of valid envelopes (with the
checksum recomputed half of the time so the header parser itself is reached),
wrong versions, wrong field types and huge declared lengths/shapes.
"""

from __future__ import annotations

import struct
import time
import zlib

import msgpack
import numpy as np

from nebula_mq.codecs import parse_codec
from nebula_mq.errors import WireError
from nebula_mq.wire import Envelope, decode_envelope, encode_envelope, pack_tensors, unpack_tensors
from nebula_mq.wire.envelope import _HEAD, _PREFIX, MAGIC

MAX = 1 << 22


def _valid() -> list[bytes]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 16)).astype(np.float32)
    out = []
    for spec in ["none", "fp16(svd(0.5))", "int8", "lz4(topk(0.3))"]:
        recs = pack_tensors({"x": x, "ids": np.arange(6)}, {"x": parse_codec(spec), "ids": parse_codec("lz4")})
        out.append(encode_envelope(Envelope("j", "f", 1, 0, 2, "p", recs, {"a": 1}), signer=lambda c: b"t" * 16))
    return out


def _reframe(region: bytes, tag: bytes = b"") -> bytes:
    """A frame with a *correct* checksum around an arbitrary region (reaches the parsers)."""
    padded = tag + bytes(-len(tag) % 8)
    return _PREFIX.pack(MAGIC, len(tag), 0, zlib.crc32(region), _PREFIX.size + len(padded) + len(region)) + padded + region


def _header_region(header: object, blob: bytes = b"") -> bytes:
    h = msgpack.packb(header, use_bin_type=True)
    return _HEAD.pack(1, 0, len(h)) + h + bytes(-len(h) % 8) + blob


def _region_of(frame: bytes) -> bytes:
    tag_len = struct.unpack_from("<H", frame, 4)[0]
    return frame[_PREFIX.size + tag_len + (-tag_len % 8):]


def _hostile_headers(rng: np.random.Generator) -> list[bytes]:
    good = {"job": "j", "flow": "f", "step": 1, "mb": 0, "seq": 1, "producer": "p", "meta": {}, "tensors": []}
    wrong_values = [None, -1, 2**64 - 1, 1.5, "x", b"b", [], {}, [[]], True, "x" * 300]
    out = []
    for key in good:
        for v in wrong_values:
            out.append(_reframe(_header_region({**good, key: v})))
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
    ]
    nested = [0, {}, [1], "float32", [["float32", [1], 0, 4]]]
    for _ in range(20):
        nested = [1, {}, [1], "float32", [nested]]
    trees.append(nested)
    for tree in trees:
        rec = ["x", tree[2], tree[3], "spec", tree]
        out.append(_reframe(_header_region({**good, "tensors": [rec]}, bytes(64))))
    for _ in range(200):  # random msgpack-ish garbage with a valid frame
        junk = rng.integers(0, 256, int(rng.integers(0, 64)), dtype=np.uint8).tobytes()
        out.append(_reframe(_HEAD.pack(1, 0, len(junk)) + junk + bytes(-len(junk) % 8)))
    out.append(_reframe(_HEAD.pack(1, 0, 2**31) + b"\x00" * 8))  # huge header length
    out.append(_reframe(_HEAD.pack(1, 0, 6) + b"\xdb\xff\xff\xff\xff" + b"a" + bytes(2)))  # str32 of 4 GiB
    out.append(_reframe(_HEAD.pack(1, 0, 5) + b"\xdd\xff\xff\xff\xff" + bytes(3)))  # array32 of 4G items
    out.append(_reframe(_HEAD.pack(1, 0, 3) + b"\x91" * 3 + bytes(5)))
    out.append(_reframe(_HEAD.pack(1, 0, 600) + b"\x91" * 600))  # deep nesting
    return out


def test_fuzz_decoder_only_raises_wire_errors() -> None:
    rng = np.random.default_rng(1234)
    valid = _valid()
    cases: list[bytes] = _hostile_headers(rng)
    for _ in range(2500):
        cases.append(rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8).tobytes())
    for _ in range(2500):
        v = valid[int(rng.integers(len(valid)))]
        cases.append(v[: int(rng.integers(0, len(v)))])
    must_fail: set[int] = set()
    for i in range(5000):
        v = bytearray(valid[int(rng.integers(len(valid)))])
        flipped = []
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(len(v)))
            v[pos] ^= 1 << int(rng.integers(8))
            flipped.append(pos)
        # Half the flips get a recomputed checksum so they reach the header/tree/codec
        # validation (flipped payload bits then legitimately decode to other values);
        # the other half must all fail unless they only touched the tag (the HMAC's job).
        if i % 2:
            cases.append(_reframe(_region_of(bytes(v))))
        else:
            if any(not _PREFIX.size <= p < _PREFIX.size + 16 for p in flipped):
                must_fail.add(len(cases))
            cases.append(bytes(v))
    for version in (0, 2, 65535):
        region = bytearray(_region_of(valid[0]))
        struct.pack_into("<H", region, 0, version)
        cases.append(_reframe(bytes(region)))
    assert len(cases) >= 10_000
    start = time.perf_counter()
    accepted = []
    for i, data in enumerate(cases):
        try:
            env = decode_envelope(data, max_bytes=MAX)
            unpack_tensors(env, max_decoded_bytes=1 << 20)  # decoding the tensors must be safe too
            accepted.append(i)
        except WireError:
            pass
    assert time.perf_counter() - start < 30
    assert not must_fail.intersection(accepted)
    assert len(must_fail) > 2000 and len(accepted) < len(cases) // 4
