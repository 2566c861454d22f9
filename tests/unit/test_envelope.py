"""Envelope round trips, zero-copy decoding, checksum/auth coverage and typed errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nebula_mq import topology
from nebula_mq.codecs import parse_codec
from nebula_mq.errors import (
    ChecksumMismatch, MalformedMessage, OversizedMessage, ShapeMismatch, TruncatedMessage, VersionMismatch,
)
from nebula_mq.wire import Envelope, decode_envelope, encode_envelope, pack_tensors, unpack_tensors
from nebula_mq.wire.envelope import _HEAD, _PREFIX

MAX = 1 << 26


def make(**overrides: object) -> Envelope:
    rng = np.random.default_rng(0)
    tensors = {"hidden": rng.standard_normal((2, 16, 32)).astype(np.float32), "ids": rng.integers(0, 999, (2, 16))}
    codecs = {"hidden": parse_codec("fp16(svd(0.5))"), "ids": parse_codec("lz4")}
    base = dict(job_id="job-a", flow="fwd", step=5, micro_batch=2, seq=9, producer="enc-0",
                tensors=pack_tensors(tensors, codecs), meta={"loss": 0.25, "sync": "tok", "n": 3, "ok": True})
    base.update(overrides)
    return Envelope(**base)  # type: ignore[arg-type]


def test_roundtrip_fields_tensors_and_message_id() -> None:
    env = make()
    got = decode_envelope(encode_envelope(env), max_bytes=MAX)
    assert (got.job_id, got.flow, got.step, got.micro_batch, got.seq, got.producer) == ("job-a", "fwd", 5, 2, 9, "enc-0")
    assert got.meta == {"loss": 0.25, "sync": "tok", "n": 3, "ok": True}
    assert got.message_id == topology.message_id("job-a", "fwd", 5, 2, 9)
    assert [t.codec for t in got.tensors] == ["fp16(svd(0.5))", "lz4"]
    want, out = unpack_tensors(env), unpack_tensors(got)
    assert np.array_equal(out["ids"], want["ids"]) and np.array_equal(out["hidden"], want["hidden"])


def test_decode_is_zero_copy_on_the_received_buffer() -> None:
    x = np.arange(4096, dtype=np.float32).reshape(64, 64)
    data = bytearray(encode_envelope(make(tensors=pack_tensors({"x": x}, parse_codec("none")))))
    got = decode_envelope(data, max_bytes=MAX)
    part = got.tensors[0].encoded.parts[0]
    assert np.shares_memory(part, np.frombuffer(data, np.uint8))
    assert part.ctypes.data % 8 == np.frombuffer(data, np.uint8).ctypes.data % 8  # 8-byte aligned offset
    assert np.array_equal(unpack_tensors(got)["x"], x)


def test_auth_tag_covers_the_same_bytes_as_the_checksum() -> None:
    seen: list[bytes] = []

    def signer(chunks: list) -> bytes:
        seen.append(b"".join(bytes(c) for c in chunks))
        return b"\x01" * 32

    env = make()
    got = decode_envelope(encode_envelope(env, signer=signer), max_bytes=MAX)
    assert got.auth_tag == b"\x01" * 32
    assert seen[0] == bytes(got.signing_bytes()) == env.signing_bytes()


@pytest.mark.parametrize("mutate, err", [
    (lambda b: b[: len(b) // 2], TruncatedMessage),
    (lambda b: b[:10], TruncatedMessage),
    (lambda b: b"XXXX" + b[4:], MalformedMessage),
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), ChecksumMismatch),
    (lambda b: b + b"\0", MalformedMessage),
])
def test_typed_errors(mutate: object, err: type) -> None:
    data = encode_envelope(make())
    with pytest.raises(err):
        decode_envelope(mutate(data), max_bytes=MAX)  # type: ignore[operator]


def test_oversized_and_wrong_version() -> None:
    data = encode_envelope(make())
    with pytest.raises(OversizedMessage):
        decode_envelope(data, max_bytes=len(data) - 1)
    buf = bytearray(data)
    _HEAD.pack_into(buf, _PREFIX.size, 2, 0, _HEAD.unpack_from(buf, _PREFIX.size)[2])
    with pytest.raises(VersionMismatch):
        decode_envelope(bytes(buf), max_bytes=MAX)


def test_record_and_tree_disagree_is_shape_mismatch() -> None:
    env = make()
    rec = dataclasses.replace(env.tensors[0], shape=(3, 3))
    data = encode_envelope(dataclasses.replace(env, tensors=(rec,)))
    with pytest.raises(ShapeMismatch):
        decode_envelope(data, max_bytes=MAX)


@given(step=st.integers(0, 2**62), seq=st.integers(0, 2**40), meta=st.dictionaries(
    st.text(min_size=1, max_size=10), st.one_of(st.integers(-2**62, 2**62), st.floats(allow_nan=False), st.text(max_size=20),
                                                st.booleans(), st.none()), max_size=8))
@settings(max_examples=50, deadline=None)
def test_header_fields_roundtrip(step: int, seq: int, meta: dict) -> None:
    env = make(step=step, seq=seq, meta=meta, tensors=())
    got = decode_envelope(encode_envelope(env), max_bytes=MAX)
    assert (got.step, got.seq, got.meta) == (step, seq, meta)
