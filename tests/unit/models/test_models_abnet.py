"""ABNet (tiny preset): the split encoder/decoder API trains exactly like the joint model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from nebula_mq.errors import ConfigError, ShapeMismatch  # noqa: E402
from nebula_mq.models.abnet import ABNet  # noqa: E402
from nebula_mq.models.abnet_config import preset, tiny  # noqa: E402
from nebula_mq.models.beam_search import beam_search, greedy_search  # noqa: E402

pytestmark = pytest.mark.paddle


def _copy_batch(rng: np.random.Generator, b: int = 8, n: int = 6) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source = random tokens (ids 3..31, padded with 0); target = BOS + source + EOS + padding."""
    lens = rng.integers(3, n + 1, b)
    src = np.zeros((b, n), np.int64)
    tgt = np.zeros((b, n + 2), np.int64)
    for i, ln in enumerate(lens):
        src[i, :ln] = rng.integers(3, 32, ln)
        tgt[i, : ln + 2] = [1, *src[i, :ln], 2]
    return src, (src != 0).astype(np.float32), tgt


def _grads(model: ABNet) -> dict[str, np.ndarray]:
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


def _clear(model: ABNet) -> None:
    for p in model.parameters():
        p.clear_gradient(set_to_zero=False)


def test_split_backward_equals_joint_backward() -> None:
    model = ABNet(tiny())
    src, mask, tgt = _copy_batch(np.random.default_rng(0))

    joint_loss = model.loss(src, mask, tgt)
    joint_loss.backward()
    joint = _grads(model)
    _clear(model)

    enc_out = model.encoder(src, mask)  # cluster S
    loss, grad = model.decoder.loss_and_grad(enc_out.numpy(), mask, tgt)  # cluster T, over the "WAN"
    model.encoder.backward(enc_out, grad)  # cluster S again
    split = _grads(model)

    assert loss == pytest.approx(float(joint_loss), rel=1e-6)
    assert set(split) == set(joint) and any(k.startswith("encoder.") for k in split)
    for name in joint:
        np.testing.assert_allclose(split[name], joint[name], rtol=1e-4, atol=1e-7, err_msg=name)
    assert grad.shape == tuple(enc_out.shape) and np.abs(grad).sum() > 0
    assert np.abs(grad[mask == 0]).max() < 1e-20  # padded source positions are (numerically) never attended


def test_only_adapters_and_head_get_gradients() -> None:
    model = ABNet(tiny())
    src, mask, tgt = _copy_batch(np.random.default_rng(1))
    model.loss(src, mask, tgt).backward()
    trainable = {id(p) for p in model.trainable_parameters()}
    for name, p in model.named_parameters():
        is_adapter = ".after_" in name or name.startswith("decoder.head.")
        assert (id(p) in trainable) == is_adapter, name
        assert (p.grad is not None) == is_adapter, name


def test_loss_decreases_on_copy_task_and_frozen_weights_stay() -> None:
    model = ABNet(tiny())
    frozen = {n: p.numpy().copy() for n, p in model.named_parameters() if p.stop_gradient}
    enc_opt = paddle.optimizer.Adam(3e-3, parameters=model.encoder.trainable_parameters())
    dec_opt = paddle.optimizer.Adam(3e-3, parameters=model.decoder.trainable_parameters())
    rng = np.random.default_rng(2)
    losses = []
    for _ in range(30):
        src, mask, tgt = _copy_batch(rng, b=16)
        enc_out = model.encoder(src, mask)
        loss, grad = model.decoder.loss_and_grad(enc_out.numpy(), mask, tgt)
        model.encoder.backward(enc_out, grad)
        for opt in (enc_opt, dec_opt):
            opt.step()
            opt.clear_grad()
        losses.append(loss)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
    for n, p in model.named_parameters():
        if n in frozen:
            np.testing.assert_array_equal(p.numpy(), frozen[n])


def test_label_smoothing_raises_loss_of_a_confident_model() -> None:
    src, mask, tgt = _copy_batch(np.random.default_rng(3))
    plain = ABNet(tiny())
    smooth = ABNet(preset("tiny", label_smoothing=0.3))
    enc = plain.encoder(src, mask).numpy()
    a = float(plain.decoder.loss(paddle.to_tensor(enc), mask, tgt))
    b = float(smooth.decoder.loss(paddle.to_tensor(enc), mask, tgt))
    assert a != pytest.approx(b)  # same seed, same weights: only the smoothing differs


def test_beam_one_equals_greedy_on_the_model() -> None:
    model = ABNet(tiny())
    src, mask, _ = _copy_batch(np.random.default_rng(4))
    enc = model.encoder(src, mask).numpy()
    step = model.decoder.next_token_scorer(enc, mask)
    greedy = greedy_search(step, len(src), 1, 2, max_len=9)
    assert beam_search(step, len(src), 1, 2, max_len=9, beam=1) == greedy
    assert model.translate(src, mask, beam=1, max_len=9) == greedy
    out = model.translate(src, mask, beam=4, max_len=9)
    assert len(out) == len(src) and all(len(s) <= 9 and not {0, 1, 2} & set(s) for s in out)


def test_cached_decoding_scores_and_translates_as_re_running_every_prefix() -> None:
    """The key/value cache is exact: same log-probabilities, same greedy and beam outputs."""
    model = ABNet(tiny())
    model.eval()
    src, mask, _ = _copy_batch(np.random.default_rng(6))
    enc = model.encoder(src, mask).numpy()
    cached = model.decoder.next_token_scorer(enc, mask)
    whole = model.decoder.next_token_scorer(enc, mask, cached=False)
    rows = np.repeat(np.arange(len(src)), 2)
    prefix = np.full((len(rows), 1), 1, np.int64)
    parents = None
    rng = np.random.default_rng(0)
    for _ in range(5):
        a, b = cached(prefix, rows, parents), whole(prefix, rows, parents)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        # beams swap places within their sentence, as beam search reorders them
        parents = np.arange(len(rows)) ^ rng.integers(0, 2, len(rows))
        prefix = np.concatenate([prefix[parents], rng.integers(3, 32, (len(rows), 1))], axis=1)
    for beam in (1, 4):
        step_cached = model.decoder.next_token_scorer(enc, mask)
        step_whole = model.decoder.next_token_scorer(enc, mask, cached=False)
        search = (lambda s: greedy_search(s, len(src), 1, 2, max_len=9)) if beam == 1 else \
            (lambda s: beam_search(s, len(src), 1, 2, max_len=9, beam=4))
        assert search(step_cached) == search(step_whole)


def test_beam_search_finds_the_sequence_greedy_misses() -> None:
    # vocab: 0 BOS, 1 EOS, 2 'a', 3 'b'. P(a)=.6, P(b)=.4; after 'a' nearly uniform; after 'b' EOS=.9
    table = {(0,): [0, 0.0, 0.6, 0.4], (0, 2): [0, 0.34, 0.33, 0.33], (0, 3): [0, 0.9, 0.05, 0.05]}

    def step(prefix: np.ndarray, rows: np.ndarray, parents: np.ndarray | None = None) -> np.ndarray:
        p = np.array([table.get(tuple(r), [0, 1.0, 0, 0]) for r in prefix]) + 1e-12
        return np.log(p)

    assert greedy_search(step, 2, 0, 1, max_len=5) == [[2], [2]]
    assert beam_search(step, 2, 0, 1, max_len=5, beam=2) == [[3], [3]]


def test_bad_inputs_raise_typed_errors() -> None:
    model = ABNet(tiny())
    src, mask, tgt = _copy_batch(np.random.default_rng(5))
    enc_out = model.encoder(src, mask)
    with pytest.raises(ShapeMismatch):
        model.encoder.backward(enc_out, np.zeros((1, 2, 3), np.float32))
    with pytest.raises(ShapeMismatch):
        model.decoder.loss_and_grad(enc_out.numpy(), mask, tgt[:3])
    with pytest.raises(ConfigError):
        preset("huge")
    with pytest.raises(ConfigError):
        preset("tiny", label_smoothing=1.5)


def test_small_preset_starts_from_the_pretrained_encoder() -> None:
    """Pretrained sides load with a pruned source vocab; near-identity adapters keep e5's states."""
    from nebula_mq.models.abnet import DecoderSide, EncoderSide
    from nebula_mq.models.abnet_config import small
    from nebula_mq.models.bert import BertEncoder, load_numpy_state, padding_bias
    from nebula_mq.models.pretrained import load_e5_small
    from nebula_mq.data.tokenizers import load_minilm_tokenizer, load_xlmr_tokenizer

    cfg = dataclasses.replace(small(encoder_layers=2, decoder_layers=1), adapter_dropout=0.0)
    ids = np.array([load_xlmr_tokenizer().encode("No se pudo abrir el archivo").ids])
    mask = np.ones(ids.shape, np.float32)
    side = EncoderSide(cfg, src_keep_ids=ids.ravel())
    side.eval()
    assert len(side.vocab.kept_ids) == len(set(ids.ravel()) | {0, 1, 2, 3})
    with paddle.no_grad():
        got = side(ids, mask).numpy()[0]
    plain_w = load_e5_small(keep_ids=ids.ravel(), layers=2)
    plain = BertEncoder(plain_w.shape)
    load_numpy_state(plain, plain_w.tensors)
    plain.eval()
    with paddle.no_grad():
        ref = plain(paddle.to_tensor(plain_w.vocab.old_to_new(ids)), padding_bias(paddle.to_tensor(mask))).numpy()[0]
    cos = (got * ref).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(ref, axis=-1)
    assert cos.min() > 0.99 and not np.allclose(got, ref)

    tgt = np.array([load_minilm_tokenizer().encode("could not open the file").ids])
    loss, grad = DecoderSide(cfg).loss_and_grad(got[None], mask, tgt)
    assert np.isfinite(loss) and grad.shape == got[None].shape and np.abs(grad).sum() > 0
