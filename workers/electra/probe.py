"""The cross-lingual transfer probe on a Scenario I run: which encoders, built how.

* ``discriminator``: the encoder of the latest ``disc-root`` checkpoint of the
  run (the job file gives its size and, for ``data = "corpus"``, the pruned
  vocabulary, re-derived exactly as the workers derive it);
* ``e5-small``: pretrained multilingual-e5-small (the reference that should transfer);
* ``random``: the discriminator's architecture and vocabulary, BERT-style random
  init (the floor: what token identity alone gives).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from nebula_mq.data.probe import ProbeSet
from nebula_mq.errors import CheckpointError, ConfigError
from nebula_mq.models.probe import (BertSentenceEncoder, SentenceEncoder, TransferResult, bert_encoder,
                                    e5_small_encoder, evaluate_transfer, xlmr_token_ids)
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.settings import Settings
from workers.electra.common import PADDLE_TURN, disc_rank_id, model_config
from workers.electra.data import corpus_vocabulary
from workers.electra.job import load_job

ENCODERS: tuple[str, ...] = ("discriminator", "e5-small", "random")
_PREFIX = "model/encoder."


def _job_vocabulary(settings: Settings) -> tuple[Any, Any]:
    """(ElectraConfig with the job's vocabulary, XLM-R ids -> job ids or None for synthetic jobs)."""
    electra = {**settings.section("electra"), "n_sub": 1}
    job = load_job(dataclasses.replace(settings, sections={**settings.sections, "electra": electra}))
    cfg = model_config(settings, job)
    if job.data != "corpus":
        return cfg, None
    kept, _ = corpus_vocabulary(settings, job, cfg)
    cfg = model_config(settings, job, kept)
    return cfg, lambda ids: _remap(ids, kept, cfg.unk_id)


def _remap(ids: np.ndarray, kept: np.ndarray, unk: int) -> np.ndarray:
    pos = np.clip(np.searchsorted(kept, ids), 0, len(kept) - 1)
    return np.where(kept[pos] == ids, pos, unk)


def discriminator_tensors(settings: Settings) -> tuple[int, dict[str, np.ndarray]]:
    """(step, encoder tensors) of the latest discriminator (rank 0) checkpoint of the run."""
    store = CheckpointStore(settings.run_dir / "checkpoints" / disc_rank_id(0))
    ckpt = store.latest()
    if ckpt is None:
        raise CheckpointError(f"no discriminator checkpoint under {store.root}: has the run trained?")
    tensors = {k[len(_PREFIX):]: np.asarray(v) for k, v in ckpt.arrays.items() if k.startswith(_PREFIX)}
    if not tensors:
        raise CheckpointError(f"{ckpt.path}: no {_PREFIX}* arrays (not an electra discriminator checkpoint)")
    return ckpt.step, tensors


def build_encoder(name: str, settings: Settings, texts: Sequence[str]) -> SentenceEncoder:
    """One of :data:`ENCODERS` for this run; ``texts`` (the probe's) size e5's pruned vocabulary."""
    if name == "e5-small":
        return e5_small_encoder(texts)
    if name not in ENCODERS:
        raise ConfigError("<probe>", "encoder", f"one of {list(ENCODERS)}", name)
    cfg, to_job_ids = _job_vocabulary(settings)
    if to_job_ids is None:
        raise ConfigError(settings.source or "<settings>", "electra.data",
                          "'corpus' (a synthetic job's vocabulary has no relation to real text)", "synthetic")
    tensors = discriminator_tensors(settings)[1] if name == "discriminator" else None
    encoder = bert_encoder(cfg.bert_config(cfg.discriminator), tensors, seed=cfg.seed * 1009)
    return BertSentenceEncoder(encoder, xlmr_token_ids(to_job_ids), cfg.pad_id, cfg.max_len)


def probe_run(settings: Settings, probe: ProbeSet, encoders: Sequence[str] = ENCODERS,
              epochs: int = 300) -> dict[str, TransferResult]:
    """Encoder name -> transfer result, every encoder on the same probe set and head recipe."""
    out = {}
    with PADDLE_TURN:
        for name in encoders:
            out[name] = evaluate_transfer(build_encoder(name, settings, probe.all_texts()), probe,
                                          epochs=epochs, seed=settings.job.seed)
    return out
