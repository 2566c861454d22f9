"""Delta compression (AQ-SGD) and gradient error feedback: the numpy state around the codecs,
driven as a worker drives it, through :class:`~nebula_mq.codecs.flow.FlowCompression`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq.codecs import CompressionSchedule, Int8, parse_codec
from nebula_mq.codecs.base import Codec
from nebula_mq.codecs.decoding import decode_tree
from nebula_mq.codecs.feedback import DeltaCompression, SampleRows, roundtrip
from nebula_mq.codecs.flow import FlowCompression, Samples
from nebula_mq.errors import ShapeMismatch


def batch(rng: np.random.Generator, ids: list[int], width: int = 6, hidden: int = 8
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = rng.integers(1, width + 1, size=len(ids))
    x = rng.standard_normal((len(ids), width, hidden)).astype(np.float32)
    return np.array(ids, np.int64), lengths, x


def sender(codec: Codec, mode: str) -> FlowCompression:
    """The sending end of a flow under ``codec`` from step 0: ``delta`` (activations) or
    ``feedback`` (gradients)."""
    role = "activation" if mode == "delta" else "gradient"
    return FlowCompression(CompressionSchedule(0, codec), main="x", role=role, delta=mode == "delta",
                           feedback=mode == "feedback")


def send(flow: FlowCompression, ids: np.ndarray, lengths: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Encode ``x`` once, as a worker does; returns what the receiver decodes from it."""
    encoded, _ = flow.encode(0, {"x": x}, Samples(ids, lengths))
    return decode_tree(encoded["x"][1])


@given(seed=st.integers(0, 2**31), chain=st.sampled_from(["int8", "fp16", "fp16(svd(0.5))", "int8(block=16)"]))
@settings(max_examples=25, deadline=None)
def test_sender_and_receiver_caches_stay_bit_identical(seed: int, chain: str) -> None:
    """The receiver rebuilds from the wire bytes what the sender rebuilt from its own
    encoding, epoch after epoch, and both caches export to identical arrays."""
    codec = parse_codec(chain)
    flow, receiver = sender(codec, "delta"), DeltaCompression()
    for epoch in range(3):
        for ids in ([0, 3, 5], [1, 2, 4]):
            sid, lengths, x = batch(np.random.default_rng([seed, ids[0]]), ids)
            x = x + 0.1 * epoch  # the activation drifts between epochs
            wire = send(flow, sid, lengths, x)  # what the receiver decodes
            x_hat = receiver.reconstruct(sid, lengths, wire)
            assert x_hat.shape == x.shape
    assert flow.delta is not None
    a, b = flow.delta.cache.export("c"), receiver.cache.export("c")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_delta_error_shrinks_as_the_activation_settles() -> None:
    """A fixed activation sent epoch after epoch through int8: the reconstruction error
    falls by orders of magnitude (the quantised change corrects the last error), while
    plain int8 stays at its one-shot error."""
    rng = np.random.default_rng(0)
    sid, lengths, x = batch(rng, [7, 8], width=5, hidden=32)
    lengths[:] = 5
    flow = sender(Int8(), "delta")
    assert flow.delta is not None
    errors = []
    for _ in range(4):
        send(flow, sid, lengths, x)
        x_hat = flow.delta.cache.gather(sid, lengths, 5, 32)
        errors.append(float(np.abs(x_hat - x).max()))
    plain = float(np.abs(roundtrip(x, Int8()) - x).max())
    assert errors[0] == pytest.approx(plain, rel=1e-6)
    assert errors[-1] < plain / 1000
    assert all(b < a for a, b in zip(errors, errors[1:]))


def test_error_feedback_sends_what_the_codec_dropped_last_time() -> None:
    """Sum of what was decoded over k rounds == sum of true gradients minus the final
    residual: nothing is lost, only delayed (EF-SGD's invariant)."""
    rng = np.random.default_rng(1)
    sid, lengths, _ = batch(rng, [3, 9], width=4, hidden=16)
    lengths[:] = 4
    flow = sender(parse_codec("int8"), "feedback")
    sent_sum = np.zeros((2, 4, 16), np.float32)
    true_sum = np.zeros((2, 4, 16), np.float32)
    for _ in range(5):
        g = rng.standard_normal((2, 4, 16)).astype(np.float32)
        true_sum += g
        sent_sum += send(flow, sid, lengths, g)
    assert flow.feedback is not None
    residual = flow.feedback.residual.gather(sid, lengths, 4, 16)
    np.testing.assert_allclose(sent_sum + residual, true_sum, atol=1e-5)
    assert np.abs(residual).max() > 0  # int8 is lossy: the residual is real


def test_residual_is_per_sample_and_padding_is_not_stored() -> None:
    flow = sender(Int8(), "feedback")
    g = np.ones((2, 3, 4), np.float32) * np.array([1.0, 1000.0], np.float32)[:, None, None]
    g[0, 0, 0] = 0.3  # row 0 of sample 10 is not constant: int8 leaves a residual there
    send(flow, np.array([10, 11]), np.array([2, 3]), g)
    assert flow.feedback is not None
    only_10 = flow.feedback.residual.gather(np.array([10]), np.array([2]), 3, 4)
    assert only_10[0, 2].tolist() == [0.0] * 4  # beyond the length: nothing stored
    assert np.abs(only_10).max() > 0
    assert np.abs(only_10).max() < 1.0 / 127  # sample 11's scale never leaks into sample 10


@given(seed=st.integers(0, 2**31))
@settings(max_examples=20, deadline=None)
def test_export_restore_roundtrip(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = SampleRows()
    sid, lengths, x = batch(rng, rng.choice(1000, size=5, replace=False).tolist())
    rows.scatter(sid, lengths, x)
    back = SampleRows.restore(rows.export("p"), "p")
    np.testing.assert_array_equal(back.gather(sid, lengths, 6, 8), rows.gather(sid, lengths, 6, 8))
    assert len(SampleRows.restore({}, "p")) == 0


def test_bad_shapes_are_typed_errors() -> None:
    rows = SampleRows()
    with pytest.raises(ShapeMismatch):
        rows.scatter(np.array([1]), np.array([9]), np.zeros((1, 3, 2), np.float32))
    rows.scatter(np.array([1]), np.array([2]), np.zeros((1, 3, 2), np.float32))
    with pytest.raises(ShapeMismatch):  # same sample, another length: a corrupt id mapping
        rows.gather(np.array([1]), np.array([3]), 3, 2)
    with pytest.raises(ShapeMismatch):
        SampleRows.restore({"p/ids": np.array([1]), "p/lengths": np.array([4]),
                            "p/rows": np.zeros((2, 2), np.float32)}, "p")
