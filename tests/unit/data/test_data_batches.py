"""Tokenized arrays and deterministic batches, with the real XLM-R and MiniLM tokenizers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq.data.batches import iter_batches, load_arrays, pad_and_truncate, tokenize_pairs, used_token_ids
from nebula_mq.errors import DataError
from nebula_mq.data.tokenizers import load_minilm_tokenizer, load_xlmr_tokenizer

SRC = ["Abrir archivo", "Guardar como", "No se puede conectar al servidor remoto", "Salir", "Y dijo Dios: Sea la luz"]
TGT = ["Open file", "Save As", "Cannot connect to the remote server", "Quit", "God said, Let there be light"]


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "train.npz"
    tokenize_pairs(SRC, TGT, load_xlmr_tokenizer(), load_minilm_tokenizer(), path, max_len_src=6, max_len_tgt=32)
    return path


def test_tokenized_split_has_padded_int32_ids_and_masks(tokenized: Path) -> None:
    arrays = load_arrays(tokenized)
    xlmr, minilm = load_xlmr_tokenizer(), load_minilm_tokenizer()
    assert arrays["src_ids"].dtype == np.int32 and arrays["tgt_mask"].dtype == np.int32
    assert arrays["index"].tolist() == list(range(len(SRC)))
    assert arrays["src_ids"].shape[1] == 6  # truncated to max_len
    for row, text in enumerate(TGT):
        expected = minilm.encode(text).ids
        n = int(arrays["tgt_mask"][row].sum())
        assert arrays["tgt_ids"][row, :n].tolist() == expected
        assert (arrays["tgt_ids"][row, n:] == minilm.token_to_id("[PAD]")).all()
    long_row = arrays["src_ids"][2].tolist()
    full = xlmr.encode(SRC[2]).ids
    assert len(full) > 6 and long_row == full[:5] + [full[-1]]  # keeps </s>


def test_truncation_keeps_the_end_token() -> None:
    ids, mask = pad_and_truncate([[0, 5, 6, 7, 2], [0, 9, 2]], max_len=4, pad_id=1)
    assert ids.tolist() == [[0, 5, 6, 2], [0, 9, 2, 1]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    with pytest.raises(DataError):
        pad_and_truncate([[0, 2]], max_len=1, pad_id=1)


def _arrays(n: int, width: int = 7) -> dict[str, np.ndarray]:
    lengths = (np.arange(n) % width) + 1
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int32)
    return {"index": np.arange(n, dtype=np.int64), "src_ids": mask * 5, "src_mask": mask}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(1, 16), st.integers(0, 1000), st.integers(0, 5))
def test_an_epoch_visits_every_sample_once_in_a_reproducible_order(n: int, batch: int, seed: int, epoch: int) -> None:
    arrays = _arrays(n)
    first = [b["index"].tolist() for b in iter_batches(arrays, batch, seed, epoch)]
    again = [b["index"].tolist() for b in iter_batches(arrays, batch, seed, epoch)]
    assert first == again
    assert sorted(i for b in first for i in b) == list(range(n))
    assert all(len(b) == batch for b in first[:-1])


def test_epochs_reshuffle_and_drop_last_and_trim(tokenized: Path) -> None:
    arrays = _arrays(50)
    e0 = np.concatenate([b["index"] for b in iter_batches(arrays, 8, seed=1, epoch=0)])
    e1 = np.concatenate([b["index"] for b in iter_batches(arrays, 8, seed=1, epoch=1)])
    assert e0.tolist() != e1.tolist()
    kept = list(iter_batches(arrays, 8, seed=1, epoch=0, drop_last=True))
    assert len(kept) == 6 and all(len(b["index"]) == 8 for b in kept)
    for b in iter_batches(arrays, 4, seed=2, epoch=0):
        assert b["src_ids"].shape[1] == b["src_mask"].sum(axis=1).max()
        assert b["src_ids"][:, -1].any()  # no all-padding column left
    for b in iter_batches(tokenized, 2, seed=0, epoch=0):  # from the .npz file
        rows = b["index"].tolist()
        assert b["tgt_ids"].shape[0] == len(rows)


def test_used_token_ids_cover_the_corpus_and_the_special_tokens() -> None:
    xlmr = load_xlmr_tokenizer()
    used = used_token_ids(xlmr, SRC)
    assert used.dtype == np.int32 and (np.diff(used) > 0).all()
    for text in SRC:
        assert set(xlmr.encode(text).ids) <= set(used.tolist())
    for token in ("<s>", "</s>", "<pad>", "<unk>"):
        assert xlmr.token_to_id(token) in used
    assert len(used) < 200  # a pruned vocabulary, not the 250k one


def test_bad_inputs_are_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError):
        load_arrays(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"not numpy")
    with pytest.raises(DataError):
        load_arrays(tmp_path / "bad.npz")
    with pytest.raises(DataError):
        next(iter_batches(_arrays(3), 0, seed=0, epoch=0))
    with pytest.raises(DataError):
        tokenize_pairs(["a"], [], load_xlmr_tokenizer(), load_minilm_tokenizer(), tmp_path / "x.npz")
