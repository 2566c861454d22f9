"""Model-ready arrays: tokenized splits in ``.npz`` files.

A tokenized split holds, for N rows, ``index`` (the row number in the split's
JSON-lines file: a stable sample id the training loop keys on), ``domain`` (its
domain's name, e.g. gettext or bible), and for each side ``<side>_ids`` / ``<side>_mask`` (int32, [N, L], right-padded, L the
longest row after truncation). Tokenizers are anything with the
``tokenizers.Tokenizer`` methods used here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from nebula_mq.errors import DataError
from nebula_mq.npyio import load_npz
from nebula_mq.atomic import atomic_writer

_PAD_TOKENS = ("<pad>", "[PAD]")


class TextTokenizer(Protocol):
    def encode_batch(self, inputs: list[str]) -> list[Any]: ...

    def token_to_id(self, token: str) -> int | None: ...


def pad_id_of(tokenizer: TextTokenizer) -> int:
    for token in _PAD_TOKENS:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


def encode_texts(tokenizer: TextTokenizer, texts: Sequence[str]) -> list[list[int]]:
    return [list(e.ids) for e in tokenizer.encode_batch(list(texts))]


def pad_and_truncate(rows: Sequence[Sequence[int]], max_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask), int32 [N, L]. A truncated row keeps its last id (the end-of-sequence token)."""
    if max_len < 2:
        raise DataError(f"max_len must be at least 2, got {max_len}")
    cut = [list(r) if len(r) <= max_len else list(r[: max_len - 1]) + [r[-1]] for r in rows]
    width = max((len(r) for r in cut), default=1) or 1
    ids = np.full((len(cut), width), pad_id, dtype=np.int32)
    mask = np.zeros((len(cut), width), dtype=np.int32)
    for i, r in enumerate(cut):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return ids, mask


def tokenize_pairs(
    src: Sequence[str],
    tgt: Sequence[str],
    src_tokenizer: TextTokenizer,
    tgt_tokenizer: TextTokenizer,
    out_path: Path,
    *,
    max_len_src: int = 128,
    max_len_tgt: int = 128,
    domains: Sequence[str] | None = None,
) -> int:
    """Tokenize aligned texts into ``out_path`` (.npz); return the number of rows.

    ``domains`` (one name per row, e.g. gettext/bible) is stored as ``domain``: both
    sides may read it, as it says nothing about either side's text."""
    if len(src) != len(tgt) or (domains is not None and len(domains) != len(src)):
        raise DataError(f"{out_path}: {len(src)} source rows, {len(tgt)} target rows"
                        + ("" if domains is None else f", {len(domains)} domains"))
    src_ids, src_mask = pad_and_truncate(encode_texts(src_tokenizer, src), max_len_src, pad_id_of(src_tokenizer))
    tgt_ids, tgt_mask = pad_and_truncate(encode_texts(tgt_tokenizer, tgt), max_len_tgt, pad_id_of(tgt_tokenizer))
    extra: dict[str, Any] = {} if domains is None else {"domain": np.array(list(domains), dtype=np.str_)}
    # Compressed: rows are padded to the longest one, and padding compresses to nothing.
    with atomic_writer(out_path) as fh:
        np.savez_compressed(
            fh,
            index=np.arange(len(src), dtype=np.int64),
            src_ids=src_ids,
            src_mask=src_mask,
            tgt_ids=tgt_ids,
            tgt_mask=tgt_mask,
            **extra,
        )
    return len(src)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        arrays = load_npz(path)
    except FileNotFoundError:
        raise DataError(f"{path}: tokenized split missing (run `nebula-mq data build`)") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable tokenized split: {exc}") from None
    if "index" not in arrays or any(len(a) != len(arrays["index"]) for a in arrays.values()):
        raise DataError(f"{path}: arrays missing an index or of unequal lengths")
    return arrays


def used_token_ids(tokenizer: TextTokenizer, texts: Sequence[str]) -> np.ndarray:
    """Sorted int32 ids the texts use, plus the tokenizer's special tokens (for vocabulary pruning)."""
    used: set[int] = set()
    for ids in encode_texts(tokenizer, texts):
        used.update(ids)
    decoder = getattr(tokenizer, "get_added_tokens_decoder", None)
    if callable(decoder):
        used.update(int(i) for i, tok in decoder().items() if getattr(tok, "special", True))
    return np.array(sorted(used), dtype=np.int32)
