"""The wire format: msgpack envelopes carrying codec trees (pure numpy/msgpack)."""

from nebula_mq.wire.envelope import (
    PROTOCOL_VERSION, Envelope, TensorRecord, decode_envelope, encode_envelope, pack_tensors, unpack_tensors,
)

__all__ = ["PROTOCOL_VERSION", "Envelope", "TensorRecord", "decode_envelope", "encode_envelope",
           "pack_tensors", "unpack_tensors"]
