"""Translate any text with a trained ABNet job, split as in training.

S's side: the XLM-R tokenizer over the full e5 vocabulary (a word the training
corpus never had still reaches the encoder as the pretrained tokenizer sees
it) and the encoder with S's latest checkpoint. The wire: the activation goes
through the job's forward codec chain, as it would cross the WAN. T's side:
the decoder with T's latest checkpoint, beam search, WordPiece detokenizing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import paddle

from nebula_mq.codecs import CompressionSchedule
from nebula_mq.codecs.feedback import roundtrip
from nebula_mq.data.batches import encode_texts, pad_and_truncate
from nebula_mq.errors import DataError
from nebula_mq.models.abnet import DecoderSide, EncoderSide
from nebula_mq.data.tokenizers import load_xlmr_tokenizer
from nebula_mq.runtime.checkpoint import Checkpoint, CheckpointStore
from nebula_mq.settings import Settings
from nebula_mq.evaluation.bleu import WordPieceDetokenizer
from workers.abnet.job import load_job, load_side, model_config, target_keep_ids
from nebula_mq.models.frameworks.paddle_backend import PaddleFramework

MAX_SOURCE_TOKENS = 128  # as `nebula-mq data build` truncates training sources


@dataclass(frozen=True)
class TrainedSides:
    steps: tuple[int, int]  # (encoder, decoder) checkpoint steps


def _latest(settings: Settings, worker: str, side: str) -> Checkpoint:
    ck = CheckpointStore(settings.run_dir / "checkpoints" / worker).latest()
    if ck is None:
        raise DataError(f"no checkpoint of the {side} ({worker}) under {settings.run_dir / 'checkpoints'}: "
                        "train the job first (nebula-mq run JOB.toml)")
    return ck


class Translator:
    """Both halves of a trained job, loaded from their latest checkpoints."""

    def __init__(self, settings: Settings) -> None:
        self.job = load_job(settings)
        if self.job.data != "corpus":
            raise DataError("nebula-mq eval translates text: the job must train on the corpus ([abnet] data = "
                            f"\"corpus\"), not {self.job.data!r}")
        seed = settings.job.seed
        cfg = model_config(self.job, seed)
        enc_ck = _latest(settings, self.job.head_id, "encoder")
        dec_ck = _latest(settings, self.job.tail_id, "decoder")
        self.encoder = EncoderSide(cfg)
        PaddleFramework().load_weights("encoder", self.encoder, enc_ck.arrays)
        train = load_side(self.job, seed, "tgt", cfg.decoder.vocab)
        self.decoder = DecoderSide(cfg, target_keep_ids(self.job, train))
        PaddleFramework().load_weights("decoder", self.decoder, dec_ck.arrays)
        self.encoder.eval()
        self.decoder.eval()
        schedule = CompressionSchedule.parse(settings.codec.forward, settings.codec.compress_from_step)
        self.codec = schedule.codec_for(enc_ck.step)
        self.sides = TrainedSides((enc_ck.step, dec_ck.step))
        self.src_pad = cfg.src_pad_id
        self.tokenizer = load_xlmr_tokenizer()
        self.detokenize = WordPieceDetokenizer()

    def translate(self, sources: Sequence[str], beam: int = 4, max_len: int = 64,
                  batch_size: int = 16) -> list[str]:
        """One hypothesis per source sentence, in order."""
        ids = encode_texts(self.tokenizer, list(sources))
        order = np.argsort([len(r) for r in ids], kind="stable")  # similar lengths per batch
        out: list[str] = [""] * len(ids)
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            src, mask = pad_and_truncate([ids[r] for r in rows], MAX_SOURCE_TOKENS, self.src_pad)
            with paddle.no_grad():
                activation = self.encoder(src, mask).numpy()  # cluster S
            received = roundtrip(activation, self.codec)  # the WAN
            hyps = self.decoder.decode(received, mask, beam=beam, max_len=max_len)  # cluster T
            for r, text in zip(rows, self.detokenize(hyps)):
                out[int(r)] = text
        return out
