"""One compression object per flow (nebula_mq.codecs.flow): encode once, roles, checkpointed state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pytest

from nebula_mq.codecs import CompressionSchedule, Int8, parse_codec
from nebula_mq.codecs.base import Codec, EncodeContext, Encoded, codec_class
from nebula_mq.codecs.decoding import decode_tree
from nebula_mq.codecs.flow import FlowCompression, Samples
from nebula_mq.errors import CodecError


@dataclass(frozen=True)
class CountingInt8(Codec):
    """Int8, counting its encode calls (no wire id: the trees it makes are Int8's)."""

    calls: list[int] = field(default_factory=list, compare=False)
    name: ClassVar[str] = "counting-int8"

    def accepts(self, dtype: np.dtype) -> bool:
        return Int8().accepts(dtype)

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        return Int8().layout(shape, dtype)

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        self.calls.append(1)
        return Int8().encode_with(x, ctx)

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        raise AssertionError("never on the wire")  # pragma: no cover


def batch(seed: int, b: int = 3, t: int = 5, h: int = 8) -> tuple[np.ndarray, Samples]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, t, h)).astype(np.float32)
    return x, Samples(np.arange(b, dtype=np.int64) + 100, np.array([5, 3, 4][:b], np.int64))


@pytest.mark.parametrize("mode", ["delta", "feedback"])
def test_a_message_is_encoded_once_under_delta_compression_and_error_feedback(mode: str) -> None:
    codec = CountingInt8()
    sender = FlowCompression(CompressionSchedule(0, codec), main="x", role="activation",
                             delta=mode == "delta", feedback=mode == "feedback")
    receiver = FlowCompression(CompressionSchedule(0, Int8()), main="x", role="activation", sender=False)
    residual = np.zeros((3, 5, 8), np.float32)
    for epoch in range(3):  # the same samples come back every epoch
        x, samples = batch(epoch)
        encoded, meta = sender.encode(epoch, {"x": x, "ids": samples.ids}, samples)
        assert len(codec.calls) == epoch + 1  # once per message, not twice
        wire = {name: decode_tree(enc) for name, (_, enc) in encoded.items()}
        got = receiver.decode(wire, meta, samples)
        valid = np.broadcast_to(np.arange(5)[None, :, None] < samples.lengths[:, None, None], x.shape)
        if mode == "delta":
            assert meta == {"delta": True}
            # Both ends rebuilt the same reference from the same bytes.
            mine, theirs = sender.delta.cache.export("c"), receiver.mirror.cache.export("c")  # type: ignore[union-attr]
            for part in mine:
                np.testing.assert_array_equal(mine[part], theirs[part])
            assert np.abs(got - x)[valid].max() < np.abs(x).max() / 50  # int8 of the change
        else:
            assert meta == {}
            # Error feedback: what was sent plus what is kept is the gradient plus what was kept.
            kept = sender.feedback.residual.gather(samples.ids, samples.lengths, 5, 8)  # type: ignore[union-attr]
            np.testing.assert_allclose((got + kept)[valid], (x + residual)[valid], rtol=1e-5, atol=1e-6)
            residual = kept


def test_role_codecs_see_each_tensors_role() -> None:
    chain = parse_codec("role(activation=fp16, gradient=int8, ids=lz4)")
    forward = FlowCompression(CompressionSchedule(0, chain), main="enc_out", role="activation")
    backward = FlowCompression(CompressionSchedule(0, chain), main="grad", role="gradient")
    x, samples = batch(0)
    fwd, _ = forward.encode(0, {"enc_out": x, "sample_ids": samples.ids}, samples)
    bwd, _ = backward.encode(0, {"grad": x}, samples)
    assert codec_class(fwd["enc_out"][1].codec_id).name == "fp16"
    assert codec_class(bwd["grad"][1].codec_id).name == "int8"
    assert codec_class(fwd["sample_ids"][1].codec_id).name == "lz4"  # side tensors: lossless, role ids


def test_schedule_sends_uncompressed_before_its_step() -> None:
    flow = FlowCompression(CompressionSchedule(10, Int8()), main="x", role="activation")
    x, _ = batch(0)
    before, _ = flow.encode(9, {"x": x})
    after, _ = flow.encode(10, {"x": x})
    np.testing.assert_array_equal(decode_tree(before["x"][1]), x)
    assert codec_class(after["x"][1].codec_id).name == "int8"


@pytest.mark.parametrize("spec", ["rsvd(0.3)", "powersgd(0.3)", "fp16(powersgd(0.5))"])
def test_lowrank_warm_start_is_checkpointed_and_restored(spec: str) -> None:
    """A restored flow encodes the next message byte for byte as the uninterrupted one."""
    chain = parse_codec(spec)
    clean = FlowCompression(CompressionSchedule(0, chain), main="x", role="activation")
    for step in range(3):
        clean.encode(step, {"x": batch(step)[0]})
    arrays = clean.state_arrays("head")
    assert set(arrays) == {"head/lowrank/x"}
    resumed = FlowCompression(CompressionSchedule(0, chain), main="x", role="activation")
    resumed.restore(arrays, "head")
    cold = FlowCompression(CompressionSchedule(0, chain), main="x", role="activation")
    x = batch(3)[0]
    want = clean.encode(3, {"x": x})[0]["x"][1].leaves()
    for got, ref in zip(resumed.encode(3, {"x": x})[0]["x"][1].leaves(), want):
        np.testing.assert_array_equal(got, ref)
    assert any(not np.array_equal(a, b) for a, b in zip(cold.encode(3, {"x": x})[0]["x"][1].leaves(), want))


def test_each_end_checkpoints_only_its_own_state() -> None:
    """Sender and receiver of a flow may share a checkpoint prefix (the decoder's): the
    receiver's mirror and the sender's caches are saved and restored by their own end."""
    sender = FlowCompression(CompressionSchedule(0, Int8()), main="x", role="activation", delta=True)
    receiver = FlowCompression(CompressionSchedule(0, Int8()), main="x", role="activation", sender=False)
    gradients = FlowCompression(CompressionSchedule(0, Int8()), main="g", role="gradient", feedback=True)
    x, samples = batch(0)
    encoded, meta = sender.encode(0, {"x": x}, samples)
    receiver.decode({"x": decode_tree(encoded["x"][1])}, meta, samples)
    gradients.encode(0, {"g": x}, samples)
    arrays = {**receiver.state_arrays("t"), **gradients.state_arrays("t")}
    assert sorted({k.rsplit("/", 1)[0] for k in arrays}) == ["t/delta", "t/feedback"]
    again = FlowCompression(CompressionSchedule(0, Int8()), main="x", role="activation", sender=False)
    again.restore(arrays, "t")
    grads_again = FlowCompression(CompressionSchedule(0, Int8()), main="g", role="gradient", feedback=True)
    grads_again.restore(arrays, "t")
    assert grads_again.state_arrays("t").keys() == gradients.state_arrays("t").keys()
    for k, v in again.state_arrays("t").items():
        np.testing.assert_array_equal(v, arrays[k])
    assert len(grads_again.mirror.cache) == 0  # the sender end never holds the mirror


def test_a_flow_without_state_adds_nothing_to_the_checkpoint() -> None:
    flow = FlowCompression(CompressionSchedule(0, parse_codec("fp16(svd(0.6))")), main="x", role="activation")
    flow.encode(0, {"x": batch(0)[0]})
    assert flow.state_arrays("head") == {}


def test_delta_without_samples_is_a_codec_error() -> None:
    flow = FlowCompression(CompressionSchedule(0, Int8()), main="x", role="activation", delta=True)
    with pytest.raises(CodecError, match="samples"):
        flow.encode(0, {"x": batch(0)[0]})
    with pytest.raises(CodecError, match="not both"):
        FlowCompression(CompressionSchedule(0, Int8()), main="x", role="activation", delta=True, feedback=True)
