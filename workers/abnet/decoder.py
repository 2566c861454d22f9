"""ABNet decoder worker (cluster T): consumes activations, replies with gradients.

For micro-batch ``j`` (strictly in order): look up the targets of the sample
ids the activation carries, compute the loss, back-propagate into the
cross-attention adapters, step the optimizer, and reply with d loss / d enc_out
(compressed by the backward chain) on the requester's reply flow.

Replay: the reply is confirmed by the broker before the activation is acked,
and the activation is acked only after the checkpoint that holds the step.
A restarted decoder recomputes the unacked micro-batches from its checkpoint
bit for bit (dropout is seeded by micro-batch), so the replies it re-sends
carry the same ids and bytes, and the encoder discards them as duplicates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import paddle

from nebula_mq.codecs.flow import Samples
from nebula_mq.data.translation import sample_lengths
from nebula_mq.errors import MalformedMessage
from nebula_mq.models.abnet import DecoderSide
from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.ordered import OrderedInbox
from nebula_mq.runtime.driver import Extras, drive
from nebula_mq.runtime.logs import get_logger
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from workers.abnet.job import (DECODER_ROLE, EVAL_KIND, adapter_optimizer, learning_rate, load_job, load_side, model_config,
                                  target_keep_ids)
from workers.abnet.evaluation import Evaluation
from workers.registry import role
from workers.split.job import Placement
from workers.split.tail import SplitTail

log = get_logger(__name__)


class AbnetDecoder(SplitTail):
    """The split tail (loop, ordering, checkpoints in ``workers.split.tail``) specialised
    to the ABNet decoder: targets, AQ-SGD mirror, error feedback and evaluation."""

    role = DECODER_ROLE
    state_prefix = "decoder"
    activation_name = "enc_out"
    model: DecoderSide

    @classmethod
    def placement_of(cls, settings: Settings) -> Placement:
        return load_job(settings)

    def __init__(self, settings: Settings, worker: Worker, rank: int = 0) -> None:
        """``worker``: of ``AbnetDecoder.identity(settings, rank)``."""
        self.job = load_job(settings)
        super().__init__(settings, self.job, worker, rank)
        self.cfg = model_config(self.job, settings.job.seed)
        self.data = load_side(self.job, settings.job.seed, "tgt", self.cfg.decoder.vocab)
        self.model = DecoderSide(self.cfg, target_keep_ids(self.job, self.data))
        self.optimizer = adapter_optimizer(self.job, self.model.trainable_parameters())
        self.evaluation = Evaluation(self.job, settings.job.seed, self.cfg.decoder.vocab,
                                     settings.run_dir, self.worker_id)

    # ------------------------------------------------------------------ specialisation

    def extras(self) -> Extras:
        return replace(super().extras(), more_to_do=self.more_to_do, handle_other=self.handle_other)

    def learning_rate(self, step: int) -> float:
        return learning_rate(self.job, self.settings.job.steps, step)

    def error_feedback(self) -> bool:
        return self.job.backward_feedback == "residual"  # per-sample residual of the gradient codec

    def samples(self, tensors: Mapping[str, np.ndarray]) -> Samples:
        return Samples(tensors["sample_ids"], sample_lengths(tensors["src_mask"]))

    def more_to_do(self) -> bool:
        return self.rank == 0 and not self.evaluation.done  # the encoder sends its evaluation to rank 0

    def handle_other(self, inbox: OrderedInbox, received: Received) -> bool:
        if received.meta.get("kind") != EVAL_KIND:
            return False
        self.evaluate(inbox, received)
        return True

    def evaluate(self, inbox: OrderedInbox, received: Received) -> None:
        """A kind=eval activation: decode, store, ack at once (re-doing it is idempotent)."""
        t = received.tensors
        total = int(received.meta.get("batches", 0))
        self.worker.status("running", phase=f"evaluating: beam-decoding batch {received.micro_batch + 1} of {total}")
        try:
            self.evaluation.on_batch(self.model, received.micro_batch, total,
                                     t["enc_out"], t["src_mask"], t["sample_ids"])
        except MalformedMessage as exc:
            inbox.reject(received, exc)
            return
        inbox.settle_unordered(received)

    def loss_and_grad(self, mb: int, activation: np.ndarray, tensors: Mapping[str, np.ndarray],
                      ) -> tuple[float, np.ndarray]:
        targets = self.data.targets(tensors["sample_ids"])
        paddle.seed(self.seed("tgt", mb))
        return self.model.loss_and_grad(activation, tensors["src_mask"], targets)


@role(DECODER_ROLE)
def main(settings: Settings, worker_index: int = 0) -> int:
    """``worker_index``: the decoder rank (``[abnet] decoder_ranks``)."""
    worker = AbnetDecoder.identity(settings, worker_index).broker_worker()
    return drive(worker, AbnetDecoder(settings, worker, worker_index))
