"""Paddle BERT building blocks: masks, adapter slots, state loading."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

paddle = pytest.importorskip("paddle")

from nebula_mq.errors import DataError  # noqa: E402
from nebula_mq.models.bert import (BertConfig, BertEncoder, causal_bias, load_numpy_state,  # noqa: E402
                                   mean_pool, padding_bias)

pytestmark = pytest.mark.paddle

CFG = BertConfig(vocab=20, hidden=32, layers=2, heads=4, ffn=64, positions=32)


def _encoder() -> BertEncoder:
    paddle.seed(0)
    enc = BertEncoder(CFG)
    enc.eval()
    return enc


ENC = _encoder()


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 19), min_size=2, max_size=10), st.integers(0, 8), st.data())
def test_causal_states_ignore_the_future(ids: list[int], cut: int, data: st.DataObject) -> None:
    cut = min(cut, len(ids) - 1)
    changed = ids[: cut + 1] + data.draw(st.lists(st.integers(1, 19), min_size=len(ids) - cut - 1,
                                                  max_size=len(ids) - cut - 1))
    out = []
    for seq in (ids, changed):
        x = paddle.to_tensor([seq])
        with paddle.no_grad():
            out.append(ENC(x, causal_bias(paddle.ones([1, len(seq)]))).numpy()[0, : cut + 1])
    np.testing.assert_allclose(out[0], out[1], atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 19), min_size=1, max_size=10), st.integers(1, 5))
def test_padding_does_not_change_real_tokens_or_pooled_vector(ids: list[int], pad: int) -> None:
    short = paddle.to_tensor([ids])
    padded = paddle.to_tensor([ids + [0] * pad])
    mask = paddle.to_tensor([[1.0] * len(ids) + [0.0] * pad])
    with paddle.no_grad():
        a = ENC(short, padding_bias(paddle.ones([1, len(ids)])))
        b = ENC(padded, padding_bias(mask))
        pa, pb = mean_pool(a, paddle.ones([1, len(ids)])), mean_pool(b, mask)
    np.testing.assert_allclose(b.numpy()[0, : len(ids)], a.numpy()[0], atol=1e-5)
    np.testing.assert_allclose(pb.numpy(), pa.numpy(), atol=1e-5)
    assert abs(float(np.linalg.norm(pa.numpy())) - 1.0) < 1e-5


def test_load_numpy_state_checks_names_and_shapes() -> None:
    enc = BertEncoder(CFG)
    good = {"embeddings.word": np.ones((20, 32), np.float32), "layers.1.ffn.inner.weight": np.ones((32, 64), np.float32)}
    load_numpy_state(enc, good)
    np.testing.assert_array_equal(enc.layers[1].ffn.inner.weight.numpy(), good["layers.1.ffn.inner.weight"])
    with pytest.raises(DataError, match="shape"):
        load_numpy_state(enc, {"layers.1.ffn.inner.weight": np.ones((64, 32), np.float32)})
    with pytest.raises(DataError, match="no parameter"):
        load_numpy_state(enc, {"layers.5.ffn.inner.weight": np.ones((32, 64), np.float32)})
