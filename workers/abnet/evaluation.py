"""Evaluation on cluster T: beam-decode kind=eval activations, score BLEU against T's references.

S sends the encoder output of the first ``eval_samples`` sentences of the eval
split; T holds the targets, so BLEU is computed here and nothing but
activations crosses the WAN. Each batch's hypotheses go to their own file
before the message is acked, so a restart (or a re-sent batch) just rewrites
the same file; once every batch is there, the scores are written to
``<run_dir>/eval.json``: BLEU and chrF (sacrebleu, case-insensitive) per domain
and over all, the number of sentences, and every hypothesis beside its reference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from nebula_mq.data.corpus_io import read_jsonl
from nebula_mq.errors import DataError, MalformedMessage
from nebula_mq.models.abnet import DecoderSide
from nebula_mq.runtime.logs import get_logger
from nebula_mq.evaluation.bleu import Detokenizer, SymbolDetokenizer, WordPieceDetokenizer, evaluation_body
from nebula_mq.atomic import write_json_atomic
from workers.abnet.job import AbnetJob, load_side

log = get_logger(__name__)


def references(job: AbnetJob, seed: int, vocab: int, split: str) -> tuple[list[str], list[str], Detokenizer]:
    """(reference texts by sample id, their domains, the detokenizer for hypotheses).

    Only target-side fields are kept: T never holds source sentences."""
    if job.data == "synthetic":
        data = load_side(job, seed, "tgt", vocab, split)
        detok = SymbolDetokenizer()
        return detok(data.arrays["tgt_ids"].tolist()), ["synthetic"] * data.n, detok
    rows = [(r["tgt"], r.get("domain", "all")) for r in read_jsonl(Path(job.data_dir) / "parallel" / f"{split}.jsonl")]
    return [t for t, _ in rows], [d for _, d in rows], WordPieceDetokenizer()


def _write_json(path: Path, body: Any) -> None:
    write_json_atomic(path, body)


class Evaluation:
    """T's side of one evaluation (one split)."""

    def __init__(self, job: AbnetJob, seed: int, vocab: int, run_dir: Path, worker_id: str) -> None:
        self.job = job
        self.seed, self.vocab = seed, vocab
        self.split = job.eval_split
        self.parts_dir = run_dir / "eval" / worker_id / self.split
        self.result_path = run_dir / "eval.json"

    @property
    def done(self) -> bool:
        return self.job.eval_samples == 0 or self.result_path.exists()

    def on_batch(self, model: DecoderSide, batch: int, total: int, enc_out: np.ndarray,
                 src_mask: np.ndarray, sample_ids: np.ndarray) -> None:
        """Decode one batch (beam search) and store its hypotheses; score when all are in."""
        if not 0 <= batch < total or total > self.job.eval_samples:
            raise MalformedMessage(f"eval batch {batch} of {total} for {self.job.eval_samples} samples")
        hyps = model.decode(enc_out, src_mask, beam=self.job.eval_beam, max_len=self.job.eval_max_len)
        _write_json(self.parts_dir / f"{batch:06d}.json",
                    {"sample_ids": [int(s) for s in sample_ids], "hypotheses": hyps})
        if len(list(self.parts_dir.glob("*.json"))) >= total:
            self.score(total)

    def score(self, total: int) -> dict[str, Any]:
        ids: list[int] = []
        hyp_ids: list[list[int]] = []
        for k in range(total):
            part = json.loads((self.parts_dir / f"{k:06d}.json").read_text())
            ids += part["sample_ids"]
            hyp_ids += part["hypotheses"]
        refs, domains, detok = references(self.job, self.seed, self.vocab, self.split)
        if max(ids) >= len(refs):
            raise DataError(f"eval sample id {max(ids)} beyond the {len(refs)} references of {self.split}")
        order = np.argsort(ids, kind="stable")  # batches arrive sorted by length: report by sample id
        ids = [ids[i] for i in order]
        hyps = detok([hyp_ids[i] for i in order])
        ref_sel, dom_sel = [refs[i] for i in ids], [domains[i] for i in ids]
        body = evaluation_body(self.split, ids, hyps, ref_sel, dom_sel, beam=self.job.eval_beam)
        _write_json(self.result_path, body)
        log.info("evaluation", split=self.split, samples=len(ids), bleu=round(body["bleu"], 2),
                 chrf=round(body["chrf"], 2))
        return body
