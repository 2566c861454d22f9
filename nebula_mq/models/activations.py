"""Activation tensors for codec benchmarks, from real Paddle models.

* :func:`pretrained_activations`: hidden states of the pretrained multilingual
  e5-small (the ABNet encoder's backbone) over real sentences from the
  installed gettext catalogues, packed into full-length rows. This is what
  crosses the WAN in Scenario II, so its spectrum is the one that matters.
* :func:`random_transformer_activations`: a randomly initialised Transformer,
  for shapes no pretrained model here has (hidden 768); its spectrum is
  flatter than a trained model's, so low-rank codecs look worse on it.
"""

from __future__ import annotations

import itertools

import numpy as np
import paddle

from nebula_mq.errors import DataError
from nebula_mq.models.bert import BertEncoder, load_numpy_state, padding_bias
from nebula_mq.models.pretrained import load_e5_small


def _sentences(limit: int) -> list[str]:
    from nebula_mq.data.catalogues import discover, message_pairs, read_catalogue

    out: list[str] = []
    for cat in discover(locales=("es", "de", "fr", "ru", "zh_CN")):
        try:
            pairs = message_pairs(read_catalogue(cat.path))
            out.extend(itertools.islice((tgt for _src, tgt in pairs), 200))
        except DataError:
            continue
        if len(out) >= limit:
            break
    if not out:
        raise DataError("no gettext catalogues installed to take sentences from")
    return out[:limit]


def pretrained_activations(batch: int, seq: int, layers: int = 6, seed: int = 0) -> np.ndarray:
    """e5-small hidden states [batch, seq, 384] over packed real sentences."""
    from nebula_mq.data.tokenizers import load_xlmr_tokenizer

    tok = load_xlmr_tokenizer()
    rng = np.random.default_rng(seed)
    sentences = _sentences(4000)
    rng.shuffle(sentences)
    stream = [i for enc in tok.encode_batch(sentences) for i in enc.ids]
    need = batch * seq
    if len(stream) < need:
        stream = stream * (need // max(1, len(stream)) + 1)
    ids = np.asarray(stream[:need], dtype=np.int64).reshape(batch, seq)
    weights = load_e5_small(keep_ids=np.unique(ids), layers=layers)
    model = BertEncoder(weights.shape)
    load_numpy_state(model, weights.tensors)
    model.eval()
    assert weights.vocab is not None
    with paddle.no_grad():
        mask = paddle.ones([batch, seq], dtype="float32")
        out = model(paddle.to_tensor(weights.vocab.old_to_new(ids)), padding_bias(mask))  # [B, T, H]
    return out.numpy().astype(np.float32)


def random_transformer_activations(shape: tuple[int, int, int], seed: int = 0) -> np.ndarray:
    """Hidden states [B, T, H] of a random-init 2-layer Transformer over Zipf-distributed tokens."""
    paddle.seed(seed)
    b, t, h = shape
    vocab = 8000
    emb = paddle.nn.Embedding(vocab, h)
    pos = paddle.nn.Embedding(t, h)
    layer = paddle.nn.TransformerEncoderLayer(h, max(1, h // 64), 4 * h, dropout=0.0)
    enc = paddle.nn.TransformerEncoder(layer, 2)
    enc.eval()
    ids = np.minimum(np.random.default_rng(seed).zipf(1.3, (b, t)), vocab - 1).astype("int64")
    with paddle.no_grad():
        x = emb(paddle.to_tensor(ids)) + pos(paddle.arange(t).unsqueeze(0))  # [B, T, H]
        out = enc(x)
    return out.numpy().astype(np.float32)
