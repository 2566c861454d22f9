"""The message envelope: one frame per broker message.

Frame layout (little-endian)::

    prefix  16 B   magic "NBMQ" | tag_len u16 | 0 u16 | crc32 u32 | frame_len u32
    tag     tag_len B, zero-padded to 8           (auth_tag; HMAC filled by the security layer)
    region  ---- the signed bytes: checksum and auth tag both cover exactly these ----
      head  8 B    version u16 | 0 u16 | header_len u32
      header       msgpack map (ids, meta, tensor records with codec trees), zero-padded to 8
      blob         raw little-endian array payloads in tree order, each 8-byte aligned and
                   zero-padded, nothing after the last (the decoder accepts no other layout)

Checksum: ``zlib.crc32`` over the region. It catches corruption and truncation
(all burst errors <= 32 bits, others with probability 1 - 2**-32) at several
GB/s, which matters for 10-100 MB activations; tampering is the job of the
HMAC auth tag over the same bytes, so a cryptographic hash here would only cost
time. The version sits inside the region so it is covered too.

Decoding is zero-copy: array parts are ``np.frombuffer`` views on the received
buffer, and every failure is a :class:`nebula_mq.errors.WireError` subclass.
:func:`unpack_tensors` materialises at most a per-envelope cap of bytes (by default
``DECODED_BYTES_PER_FRAME_BYTE`` times the frame cap), so a small frame cannot
decode to gigabytes.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import msgpack
import numpy as np

from nebula_mq import topology
from nebula_mq.codecs import decode_tree  # the package import registers every codec
from nebula_mq.codecs.base import Encoded
from nebula_mq.codecs.decoding import DEFAULT_MAX_DECODED_BYTES, DecodeBudget
from nebula_mq.errors import (
    ChecksumMismatch, DecodedTooLarge, MalformedMessage, OversizedMessage, ShapeMismatch, TruncatedMessage,
    VersionMismatch, WireError,
)
from nebula_mq.wire.tree import PayloadReader, PayloadWriter, pad, tree_from_wire, tree_to_wire

PROTOCOL_VERSION = 1
MAGIC = b"NBMQ"
_PREFIX = struct.Struct("<4sHHII")
_HEAD = struct.Struct("<HHI")
MAX_HEADER_BYTES = 1 << 20
MAX_TENSORS = 256
MAX_META = 64
MAX_TAG = 256
#: Default cap on the bytes one envelope may decode to (every node counted), per
#: byte of the largest accepted frame; the factor runtime/channel.py passes too.
#: A frame of fp16(svd(0.6)) decodes to ~4.8x its size (the tensor at ~0.35 of it
#: plus its fp32 factors), so frames up to ~80% of the cap decode in full.
DECODED_BYTES_PER_FRAME_BYTE = 4
MetaValue = Union[int, float, str, bool, None]
Signer = Callable[[Sequence[Union[bytes, memoryview]]], bytes]


@dataclass(frozen=True, eq=False)
class TensorRecord:
    name: str
    shape: tuple[int, ...]  # of the original tensor (checked again after decoding)
    dtype: str  # numpy dtype name of the original tensor
    codec: str  # chain spec that produced ``encoded``; informational, the tree is authoritative
    encoded: Encoded


@dataclass(frozen=True, eq=False)
class Envelope:
    job_id: str
    flow: str
    step: int
    micro_batch: int
    seq: int  # per (producer, flow) sequence number, for ordering and dedup
    producer: str  # worker id of the sender
    tensors: tuple[TensorRecord, ...] = ()
    # Small scalar map: sync-token fields, loss values, flags.
    meta: Mapping[str, MetaValue] = field(default_factory=dict)
    version: int = PROTOCOL_VERSION
    # Filled by the security layer (HMAC over signing_bytes()); empty when unauthenticated.
    auth_tag: bytes = b""
    # On decoded envelopes: zero-copy view of the signed region as received.
    received_region: memoryview | None = field(default=None, repr=False)
    # On decoded envelopes: how many bytes unpack_tensors may materialise (see decode_envelope).
    max_decoded_bytes: int | None = field(default=None, repr=False)

    @property
    def message_id(self) -> str:
        return topology.message_id(self.job_id, self.flow, self.producer, self.seq)

    def signing_bytes(self) -> bytes | memoryview:
        """The exact bytes the checksum and the auth tag cover."""
        if self.received_region is not None:
            return self.received_region
        return b"".join(_region_chunks(self))


def _header(env: Envelope, out: PayloadWriter) -> dict[str, Any]:
    tensors = [[t.name, list(t.shape), t.dtype, t.codec, tree_to_wire(t.encoded, out)] for t in env.tensors]
    return {"job": env.job_id, "flow": env.flow, "step": env.step, "mb": env.micro_batch, "seq": env.seq,
            "producer": env.producer, "meta": dict(env.meta), "tensors": tensors}


def _region_chunks(env: Envelope) -> list[bytes | memoryview]:
    blob = PayloadWriter()
    try:
        header = msgpack.packb(_header(env, blob), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise MalformedMessage(f"envelope cannot be serialised: {exc}") from None
    head = _HEAD.pack(env.version, 0, len(header))
    return [head, header, bytes(pad(len(header))), *blob.chunks]


def encode_envelope(env: Envelope, *, signer: Signer | None = None) -> bytes:
    """Serialise; ``signer(chunks) -> tag`` (e.g. an HMAC) sees exactly signing_bytes()."""
    chunks = _region_chunks(env)
    crc = 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
    tag = signer(chunks) if signer is not None else env.auth_tag
    if len(tag) > MAX_TAG:
        raise MalformedMessage(f"auth tag longer than {MAX_TAG} bytes")
    region_len = sum(len(c) for c in chunks)
    frame_len = _PREFIX.size + len(tag) + pad(len(tag)) + region_len
    prefix = _PREFIX.pack(MAGIC, len(tag), 0, crc, frame_len)
    return b"".join([prefix, tag, bytes(pad(len(tag))), *chunks])


def decode_envelope(data: bytes | bytearray | memoryview, *, max_bytes: int,
                    max_decoded_bytes: int | None = None) -> Envelope:
    """Parse and verify a frame. Every failure is a WireError subclass.

    ``max_decoded_bytes`` (default ``DECODED_BYTES_PER_FRAME_BYTE * max_bytes``) is
    recorded on the envelope as the cap :func:`unpack_tensors` enforces.
    """
    if max_decoded_bytes is None:
        max_decoded_bytes = DECODED_BYTES_PER_FRAME_BYTE * max_bytes
    try:
        return _decode(data, max_bytes, max_decoded_bytes)
    except WireError:
        raise
    except (ValueError, TypeError, OverflowError, KeyError, IndexError, AttributeError,
            struct.error, msgpack.UnpackException, RecursionError, MemoryError) as exc:
        raise MalformedMessage(f"malformed envelope: {type(exc).__name__}: {exc}") from None


def _decode(data: bytes | bytearray | memoryview, max_bytes: int, max_decoded_bytes: int) -> Envelope:
    mv = memoryview(data)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    n = len(mv)
    if n > max_bytes:
        raise OversizedMessage(f"envelope of {n} bytes exceeds {max_bytes}")
    if n < _PREFIX.size:
        raise TruncatedMessage(f"envelope of {n} bytes is shorter than its prefix")
    magic, tag_len, reserved, crc, frame_len = _PREFIX.unpack_from(mv)
    if magic != MAGIC or reserved:
        raise MalformedMessage("not a nebula-mq envelope (bad magic)")
    if frame_len != n:
        cls = TruncatedMessage if frame_len > n else MalformedMessage
        raise cls(f"envelope declares {frame_len} bytes, got {n}")
    region_at = _PREFIX.size + tag_len + pad(tag_len)
    if tag_len > MAX_TAG or region_at + _HEAD.size > n:
        raise TruncatedMessage("envelope ends inside its auth tag or head")
    version, reserved, header_len = _HEAD.unpack_from(mv, region_at)
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(f"envelope version {version}, this build speaks {PROTOCOL_VERSION}")
    header_at = region_at + _HEAD.size
    blob_at = header_at + header_len + pad(header_len)
    if reserved or header_len > MAX_HEADER_BYTES or blob_at > n:
        raise TruncatedMessage("envelope header runs past the end")
    region = mv[region_at:]
    if zlib.crc32(region) != crc:
        raise ChecksumMismatch("envelope checksum does not match")
    if any(mv[header_at + header_len:blob_at]):
        raise MalformedMessage("non-zero padding after the envelope header")
    header = msgpack.unpackb(
        mv[header_at:header_at + header_len], raw=False, strict_map_key=True, use_list=True,
        max_str_len=1 << 16, max_bin_len=1 << 16, max_array_len=1 << 12, max_map_len=1 << 8, max_ext_len=0,
    )
    tag = bytes(mv[_PREFIX.size:_PREFIX.size + tag_len])
    return _envelope(header, mv[blob_at:], tag, region, max_decoded_bytes)


def _field(h: Mapping[str, Any], key: str, kind: type) -> Any:
    raw = h.get(key)
    if type(raw) is not kind:
        raise MalformedMessage(f"envelope field {key!r} must be {kind.__name__}, got {type(raw).__name__}")
    value: Any = raw  # of type ``kind`` now
    if kind is str and not 0 < len(value) <= 256:
        raise MalformedMessage(f"envelope field {key!r} must be 1..256 characters")
    if kind is int and not 0 <= value < 2**63:
        raise MalformedMessage(f"envelope field {key!r} out of range")
    return value


def _envelope(h: Any, blob: memoryview, tag: bytes, region: memoryview, max_decoded_bytes: int) -> Envelope:
    if not isinstance(h, dict) or set(h) != {"job", "flow", "step", "mb", "seq", "producer", "meta", "tensors"}:
        raise MalformedMessage("envelope header has missing or unknown fields")
    meta = h["meta"]
    if not isinstance(meta, dict) or len(meta) > MAX_META or not all(
        isinstance(k, str) and len(k) <= 64 and (v is None or isinstance(v, (int, float, str, bool)))
        for k, v in meta.items()
    ):
        raise MalformedMessage("envelope meta must be a small map of names to scalars")
    raw_tensors = h["tensors"]
    if not isinstance(raw_tensors, list) or len(raw_tensors) > MAX_TENSORS:
        raise MalformedMessage("envelope tensors must be a list")
    tensors = []
    reader = PayloadReader(blob)
    for raw in raw_tensors:
        if not isinstance(raw, list) or len(raw) != 5:
            raise MalformedMessage("tensor record must be [name, shape, dtype, codec, tree]")
        name, shape, dtype, codec, tree = raw
        if not isinstance(name, str) or not isinstance(codec, str) or not isinstance(shape, list):
            raise MalformedMessage("tensor record has fields of the wrong type")
        enc = tree_from_wire(tree, reader)
        if tuple(shape) != enc.shape or dtype != enc.dtype:
            raise ShapeMismatch(f"tensor {name!r}: record says {dtype}{shape}, tree says {enc.dtype}{enc.shape}")
        tensors.append(TensorRecord(name, enc.shape, enc.dtype, codec, enc))
    reader.finish()
    if len({t.name for t in tensors}) != len(tensors):
        raise MalformedMessage("duplicate tensor names")
    return Envelope(
        job_id=_field(h, "job", str), flow=_field(h, "flow", str), step=_field(h, "step", int),
        micro_batch=_field(h, "mb", int), seq=_field(h, "seq", int), producer=_field(h, "producer", str),
        tensors=tuple(tensors), meta=meta, auth_tag=tag, received_region=region, max_decoded_bytes=max_decoded_bytes,
    )


def pack_tensors(tensors: Mapping[str, np.ndarray], codec: Any, *,
                 allow_non_finite: bool = False) -> tuple[TensorRecord, ...]:
    """Encode named tensors into records. ``codec``: one Codec, or a name -> Codec map. A flow
    whose codec keeps state or picks by role encodes through its ``FlowCompression`` instead."""
    out = []
    for name, x in tensors.items():
        c = codec[name] if isinstance(codec, Mapping) else codec
        arr = np.asarray(x)
        enc = c.encode(arr, allow_non_finite=allow_non_finite)
        out.append(TensorRecord(name, tuple(arr.shape), arr.dtype.name, c.spec, enc))
    return tuple(out)


def unpack_tensors(env: Envelope, *, max_decoded_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Decode every tensor; CodecError/ShapeMismatch on anything inconsistent.

    At most ``max_decoded_bytes`` are materialised for the whole envelope, every
    node of every tree counted (default: the cap decode_envelope recorded, else
    DEFAULT_MAX_DECODED_BYTES for envelopes built locally); DecodedTooLarge beyond.
    """
    cap = max_decoded_bytes if max_decoded_bytes is not None else env.max_decoded_bytes
    budget = DecodeBudget(cap if cap is not None else DEFAULT_MAX_DECODED_BYTES)
    declared = sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in env.tensors)
    if declared > budget.limit:  # refused before decoding anything
        raise DecodedTooLarge(f"tensors {[t.name for t in env.tensors]} would decode to {declared} bytes, "
                              f"more than the cap of {budget.limit} per message")
    out: dict[str, np.ndarray] = {}
    for t in env.tensors:
        arr = decode_tree(t.encoded, budget=budget)
        if arr.shape != t.shape or arr.dtype.name != t.dtype:
            raise ShapeMismatch(f"tensor {t.name!r}: decoded {arr.dtype}{arr.shape}, expected {t.dtype}{t.shape}")
        out[t.name] = arr
    return out
