"""Tokenized arrays, with the real XLM-R and MiniLM tokenizers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nebula_mq.data.batches import load_arrays, pad_and_truncate, tokenize_pairs, used_token_ids
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
        tokenize_pairs(["a"], [], load_xlmr_tokenizer(), load_minilm_tokenizer(), tmp_path / "x.npz")
