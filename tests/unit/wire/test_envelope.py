"""Envelope round trips, zero-copy decoding, checksum/auth coverage and typed errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nebula_mq import topology
from nebula_mq.codecs import parse_codec
from nebula_mq.errors import (
    ChecksumMismatch, DecodedTooLarge, MalformedMessage, OversizedMessage, ShapeMismatch, TruncatedMessage,
    VersionMismatch,
)
from nebula_mq.wire import Envelope, decode_envelope, encode_envelope, pack_tensors, unpack_tensors
from nebula_mq.wire.envelope import _HEAD, _PREFIX, DECODED_BYTES_PER_FRAME_BYTE
from tests.fixtures.frames import header_region, reframe, region_of, split_region

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
    assert got.message_id == topology.message_id("job-a", "fwd", "enc-0", 9)
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


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "int8", "int8(block=8)", "int4", "int3", "int2",
                                  "svd(0.5)", "rsvd(0.5)",
                                  "powersgd(0.5)", "topk(0.5)", "lz4"])
def test_zero_d_tensors_roundtrip(spec: str) -> None:
    tensors = {"scalar": np.array(2.5, np.float32), "loss": np.array(-0.75)}
    got = decode_envelope(encode_envelope(make(tensors=pack_tensors(tensors, parse_codec(spec)))), max_bytes=MAX)
    out = unpack_tensors(got)
    assert {k: (v.shape, v.dtype, float(v)) for k, v in out.items()} == {
        "scalar": ((), np.dtype(np.float32), 2.5), "loss": ((), np.dtype(np.float64), -0.75)}


def _zeros_frame(*names: str, n: int = 1 << 18, spec: str = "lz4") -> bytes:
    """A valid frame of float32 zero tensors of n * 4 bytes each (a few KiB on the wire with lz4)."""
    tensors = {name: np.zeros(n, np.float32) for name in names}
    return encode_envelope(make(tensors=pack_tensors(tensors, parse_codec(spec))))


def test_decoded_bytes_cap_defaults_to_a_multiple_of_the_frame_cap() -> None:
    frame = _zeros_frame("x")  # 1 MiB decoded; lz4 needs as much again while decompressing
    assert len(frame) < 1 << 14
    with pytest.raises(DecodedTooLarge):  # accepted frames of up to 64 KiB may decode to 256 KiB
        unpack_tensors(decode_envelope(frame, max_bytes=1 << 16))
    env = decode_envelope(frame, max_bytes=1 << 19)  # 2 MiB allowed: exactly enough
    assert env.max_decoded_bytes == DECODED_BYTES_PER_FRAME_BYTE << 19
    assert not unpack_tensors(env)["x"].any()
    assert unpack_tensors(decode_envelope(frame, max_bytes=1 << 16, max_decoded_bytes=2 << 20))["x"].shape == (1 << 18,)


def test_decoded_bytes_cap_covers_all_tensors_of_an_envelope() -> None:
    env = decode_envelope(_zeros_frame("a", "b", "c", n=1 << 16, spec="none"), max_bytes=MAX)  # 256 KiB each
    with pytest.raises(DecodedTooLarge):  # each tensor alone is under the cap, all three are not
        unpack_tensors(env, max_decoded_bytes=3 << 17)  # as runtime/channel.py passes it
    assert len(unpack_tensors(env, max_decoded_bytes=3 << 18)) == 3


def _two_part_frame() -> tuple[dict, bytes]:
    """Header and blob of a frame with parts x (12 bytes, padded to 16) and y (8 bytes at 16)."""
    tensors = {"x": np.array([1, 2, 3], np.float32), "y": np.array([4, 5], np.float32)}
    header, blob = split_region(encode_envelope(make(tensors=pack_tensors(tensors, parse_codec("none")))))
    assert [t[4][4][0][2:] for t in header["tensors"]] == [[0, 12], [16, 8]] and len(blob) == 24
    return header, blob


def _move_part(header: dict, tensor: int, offset: int) -> dict:
    header["tensors"][tensor][4][4][0][2] = offset
    return header


LAYOUTS = {
    "overlapping parts": (lambda h, b: (_move_part(h, 1, 0), b), "overlaps"),
    "unaligned part": (lambda h, b: (_move_part(_move_part(h, 0, 4), 1, 16), bytes(4) + b[:12] + bytes(8)),
                       "aligned"),
    "gap between parts": (lambda h, b: (_move_part(h, 1, 24), b[:16] + bytes(8) + b[16:]), "gap"),
    "trailing bytes": (lambda h, b: (h, b + bytes(8)), "trailing"),
    "data in the padding": (lambda h, b: (h, b[:12] + b"\x01" + b[13:]), "padding"),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_payload_parts_must_follow_each_other_aligned_without_overlap_or_trailing_bytes(name: str) -> None:
    mutate, message = LAYOUTS[name]
    header, blob = mutate(*_two_part_frame())
    with pytest.raises(MalformedMessage, match=message):
        decode_envelope(reframe(header_region(header, blob)), max_bytes=MAX)


def test_many_tensors_sharing_one_compressed_payload_are_refused() -> None:
    """The amplification attack: a tiny frame whose tensors all decompress the same bytes."""
    header, blob = split_region(_zeros_frame("t0"))
    record = header["tensors"][0]
    header["tensors"] = [[f"t{i}", *record[1:]] for i in range(16)]  # 16 x 1 MiB from one payload
    with pytest.raises(MalformedMessage, match="overlaps"):
        decode_envelope(reframe(header_region(header, blob)), max_bytes=MAX)


def test_header_padding_must_be_zero() -> None:
    region = bytearray(region_of(encode_envelope(make(tensors=()))))
    header_len = _HEAD.unpack_from(region)[2]
    assert header_len % 8, "the test needs a header that is padded"
    region[_HEAD.size + header_len] = 0xFF
    with pytest.raises(MalformedMessage, match="padding"):
        decode_envelope(reframe(bytes(region)), max_bytes=MAX)
