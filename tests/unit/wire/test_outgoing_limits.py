"""The size check of an outgoing frame (``nebula_mq.wire.limits``): a frame above the limit is
refused with one line naming the flow, the micro-batch, both sizes and the codecs that would
fit, and a frame re-encoded with a codec it names does fit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq.codecs import Identity, parse_codec
from nebula_mq.errors import OversizedMessage
from nebula_mq.settings import BROKER_MAX_MESSAGE_BYTES
from nebula_mq.wire import Envelope, encode_envelope, pack_tensors
from nebula_mq.wire.limits import MessageTooLarge, check_outgoing, limit_text, megabytes, send_limit

TAG = b"t" * 32  # an HMAC-SHA256's length


def frame(tensors: dict[str, np.ndarray], spec: str = "none", mb: int = 12) -> tuple[Envelope, bytes]:
    env = Envelope("j", "act", 3, mb, mb, "head-0", pack_tensors(tensors, parse_codec(spec)))
    return env, encode_envelope(env, signer=lambda chunks: TAG)


def refusal(env: Envelope, body: bytes, limit: int) -> MessageTooLarge:
    with pytest.raises(MessageTooLarge) as info:
        check_outgoing(env, len(body), limit)
    return info.value


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(8, 64), cols=st.integers(8, 64), extra=st.integers(1, 3000), seed=st.integers(0, 999))
def test_a_codec_named_for_an_oversized_frame_fits_when_used(rows: int, cols: int, extra: int, seed: int) -> None:
    x = np.random.default_rng(seed).normal(size=(2, rows, cols)).astype(np.float32)
    ids = np.arange(rows, dtype=np.int64)
    env, body = frame({"h": x, "ids": ids})
    limit = len(body) - extra
    check_outgoing(env, len(body), len(body))  # at the limit: sent
    exc = refusal(env, body, limit)
    assert isinstance(exc, OversizedMessage) and exc.reason == "oversized"
    assert "\n" not in str(exc) and str(exc).startswith("flow 'act' micro-batch 12: ")
    assert f"> max_message_bytes {limit_text(limit)}" in str(exc)
    if extra <= x.nbytes // 2 - 256:  # fp16 saves half of h, more than the header slack of two tensors
        assert exc.fits
    for fit in exc.fits:
        assert fit.spec in str(exc)
        codecs = {"h": parse_codec(fit.spec), "ids": Identity()}  # ids stay raw: these codecs take floats
        again = Envelope("j", "act", 3, 12, 12, "head-0", pack_tensors({"h": x, "ids": ids}, codecs))
        assert len(encode_envelope(again, signer=lambda chunks: TAG)) <= limit, fit


def test_the_line_says_what_fits_and_what_the_broker_would_take() -> None:
    env, body = frame({"h": np.ones((4, 256, 256), np.float32)})  # ~1 MB raw
    exc = refusal(env, body, 600_000)
    text = str(exc)
    assert text.startswith(f"flow 'act' micro-batch 12: {megabytes(len(body))} encoded (none) "
                           "> max_message_bytes 600000 bytes; fp16 (")
    assert " or rsvd(0.2) (rank 51, " in text and "would fit" in text
    assert text.endswith("(or raise [transport] max_message_bytes, up to 128 MiB)")
    assert [f.spec for f in exc.fits] == ["fp16", "rsvd(0.2)"]


def test_nothing_fits_below_the_envelope_itself() -> None:
    env, body = frame({"h": np.ones((64, 64), np.float32)})
    text = str(refusal(env, body, 200))
    assert "; no codec would fit; send fewer or smaller tensors per micro-batch" in text


def test_the_brokers_cap_bounds_a_limit_built_in_code() -> None:
    assert send_limit(96 * 2**20) == (96 * 2**20, "max_message_bytes")
    assert send_limit(BROKER_MAX_MESSAGE_BYTES + 1) == (BROKER_MAX_MESSAGE_BYTES, "the brokers' max_message_size")
    assert limit_text(96 * 2**20) == "96 MiB" and megabytes(140_200_000) == "140.2 MB"
