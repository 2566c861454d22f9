"""An activation narrowed to float16 on its device (``models.frameworks`` ``narrow_fp16``)
travels exactly as if the fp16 codec had cast it on the host: the same bytes, the same decoded
float32, the same refusals. The GPU check asserts the same on CUDA (tests/gpu/check.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nebula_mq.codecs import parse_codec
from nebula_mq.codecs.cast import FP16
from nebula_mq.codecs.decoding import decode_tree
from nebula_mq.codecs.flow import CompressionSchedule, FlowCompression
from nebula_mq.errors import CodecError, NonFiniteTensor

torch = pytest.importorskip("torch")
from nebula_mq.models.frameworks.torch_backend import fp16_narrowed  # noqa: E402

EDGES = np.array([0.0, -0.0, 1e-8, -6e-8, 6.1e-5, 1.0, -1.5, 65503.0, 65504.0, 65519.99, 65520.0, 7e4,
                  -65520.0, -1e30, 3.4e38, np.nextafter(np.float32(1), np.float32(2))], dtype=np.float32)


def same(x: np.ndarray) -> None:
    codec = FP16()
    host = codec.encode(x)
    device = codec.encode_narrowed(fp16_narrowed(torch.from_numpy(x)))
    assert (host.codec_id, dict(host.params), host.shape, host.dtype) == (
        device.codec_id, dict(device.params), device.shape, device.dtype)
    assert host.leaves()[0].tobytes() == device.leaves()[0].tobytes()
    assert decode_tree(host).tobytes() == decode_tree(device).tobytes()


def test_fp16_decodes_every_bit_pattern_as_numpys_cast() -> None:
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(256, 256)
    encoded = FP16().encode_narrowed(halves, allow_non_finite=True)
    assert decode_tree(encoded).view(np.uint32).tobytes() == halves.astype(np.float32).view(np.uint32).tobytes()


def test_edge_values_narrow_as_the_codec_casts_them() -> None:
    same(EDGES)
    same(EDGES.reshape(4, 4))


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, st.integers(0, 300), elements=st.floats(-1e6, 1e6, width=32)))
def test_any_finite_float32_narrows_as_the_codec_casts_it(x: np.ndarray) -> None:
    same(x)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_refused_as_the_codec_refuses_them(bad: float) -> None:
    x = np.array([1.0, bad, 2.0], dtype=np.float32)
    with pytest.raises(NonFiniteTensor, match="NaN or Inf"):
        FP16().encode(x)
    with pytest.raises(NonFiniteTensor, match="NaN or Inf"):
        FP16().encode_narrowed(fp16_narrowed(torch.from_numpy(x)))
    kept = FP16().encode_narrowed(fp16_narrowed(torch.from_numpy(x)), allow_non_finite=True)
    assert decode_tree(kept).tobytes() == decode_tree(FP16().encode(x, allow_non_finite=True)).tobytes()


def test_a_flow_takes_a_narrowed_tensor_only_where_its_codec_is_plain_fp16() -> None:
    def flow(spec: str, **kw: bool) -> FlowCompression:
        return FlowCompression(CompressionSchedule.parse(spec), main="activation", role="activation", **kw)

    assert flow("fp16").takes_fp16(0)
    assert not flow("fp16", delta=True).takes_fp16(0)  # the delta is taken in float32
    assert not flow("int8").takes_fp16(0) and not flow("fp16(svd(0.5))").takes_fp16(0)
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    ids = np.arange(8, dtype=np.int64)
    narrowed, _ = flow("fp16").encode(0, {"activation": fp16_narrowed(torch.from_numpy(x)), "sample_ids": ids},
                                      narrowed=True)
    host, _ = flow("fp16").encode(0, {"activation": x, "sample_ids": ids})
    assert narrowed.keys() == host.keys() and narrowed["activation"][0] == host["activation"][0] == "fp16"
    assert decode_tree(narrowed["activation"][1]).tobytes() == decode_tree(host["activation"][1]).tobytes()
    with pytest.raises(CodecError, match="needs the plain fp16 codec"):
        flow("int8").encode(0, {"activation": x.astype(np.float16)}, narrowed=True)
    assert parse_codec("fp16") == FP16()
