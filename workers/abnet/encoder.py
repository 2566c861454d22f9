"""ABNet encoder worker (cluster S): activations forward, gradients back.

Schedule (deterministic, whatever the timing): up to ``in_flight`` micro-batches
wait for their gradient at once. Micro-batch ``j`` is sent as soon as the
gradients of micro-batches ``< j - in_flight + 1`` are applied, and gradients
are applied strictly in micro-batch order, one optimizer step each.

Recompute at apply time: when the gradient of ``j`` arrives, the encoder
forward of ``j`` is recomputed with the current adapters (same dropout seed)
and the received gradient is back-propagated through it. Holding ``in_flight``
autograd graphs instead would tie memory to the window and would make a
resumed worker differ from a clean one (it would need the adapters of every
in-flight micro-batch). With recompute, a checkpoint at step ``c`` is all a
restarted worker needs: micro-batches ``< next_fwd`` were confirmed by the
broker before the checkpoint, so they are never re-sent with other weights.
The cost is one extra encoder forward per micro-batch; the gradient comes
from weights up to ``in_flight - 1`` steps older (bounded staleness, as in
asynchronous pipeline training); with ``in_flight = 1`` it is exact.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import paddle

from nebula_mq.codecs import LZ4
from nebula_mq.codecs.flow import Samples
from nebula_mq.data.translation import sample_lengths
from nebula_mq.errors import TrainingDiverged
from nebula_mq.models.abnet import EncoderSide
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.driver import Extras, drive
from nebula_mq.runtime.logs import get_logger
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from workers.abnet.job import (ENCODER_ROLE, EVAL_KIND, adapter_optimizer, eval_producer, learning_rate, load_job, load_side,
                                  model_config)
from workers.registry import role
from workers.split.head import Forward, SplitHead
from workers.split.job import Placement

log = get_logger(__name__)

# Token spread (see step_values) below which the encoder has collapsed; pretrained e5
# starts near 0.37, a trained one stays there.
COLLAPSED_SPREAD = 1e-3


class AbnetEncoder(SplitHead):
    """The split head (loop, window, recompute, checkpoints in ``workers.split.head``)
    specialised to the ABNet encoder: its data, AQ-SGD deltas and evaluation."""

    role = ENCODER_ROLE
    state_prefix = "encoder"
    activation_name = "enc_out"

    @classmethod
    def placement_of(cls, settings: Settings) -> Placement:
        return load_job(settings)

    def __init__(self, settings: Settings, worker: Worker, rank: int = 0) -> None:
        """``worker``: of ``AbnetEncoder.identity(settings, rank)``."""
        self.job = load_job(settings)
        super().__init__(settings, self.job, worker, rank)
        self.cfg = model_config(self.job, settings.job.seed)
        self.model = EncoderSide(self.cfg)
        if self.job.encoder_init:  # the frozen stack is in no checkpoint: set it at every start
            from workers.abnet.encoder_init import init_encoder

            init_encoder(self.model, self.job.encoder_init, settings.source)
        self.optimizer = adapter_optimizer(self.job, self.model.trainable_parameters())
        self.data = load_side(self.job, settings.job.seed, "src", self.cfg.encoder.vocab)
        self._collapse_reported = False

    # ------------------------------------------------------------------ specialisation

    def extras(self) -> Extras:
        return replace(super().extras(), after_training=self.after_training)

    def learning_rate(self, step: int) -> float:
        return learning_rate(self.job, self.settings.job.steps, step)

    def delta_compression(self) -> bool:
        return self.job.forward_feedback == "delta"  # AQ-SGD reference per sample, mirrored on T

    def samples(self, fwd: Forward) -> Samples:
        return Samples(fwd.sample_ids, sample_lengths(fwd.side["src_mask"]))

    def _forward(self, mb: int) -> tuple[np.ndarray, np.ndarray, paddle.Tensor]:
        sample_ids, ids, mask = self.data.source(mb)
        rows = self.shard_rows(len(sample_ids))
        paddle.seed(self.seed("src", mb))
        return sample_ids[rows], mask[rows], self.model(ids[rows], mask[rows])

    def forward(self, mb: int) -> Forward:
        sample_ids, mask, enc_out = self._forward(mb)
        return Forward(sample_ids, enc_out, {"src_mask": mask})

    def step_values(self, parts: tuple[Received, ...], fwd: Forward) -> dict[str, float]:
        """The loss, and how much the encoder's output differs between tokens (the mean over
        hidden units of the spread across the batch's real tokens). A collapsed encoder gives
        every token the same vector, and the decoder can then only learn the target language."""
        values = super().step_values(parts, fwd)
        mask = fwd.side["src_mask"].astype(bool)
        tokens = fwd.activation.numpy()[mask]  # [N, H]
        spread = float(tokens.std(axis=0).mean()) if len(tokens) > 1 else float("nan")
        values["token_spread"] = spread
        if spread < COLLAPSED_SPREAD and not self._collapse_reported:
            self._collapse_reported = True
            hint = "every token now has the same vector: lower [abnet] lr, or raise warmup_steps or grad_clip"
            log.error("encoder_collapsed", token_spread=spread, step=self.worker.step, hint=hint)
            if self.job.on_collapse == "stop":
                # Stop before the next checkpoint overwrites the last good one.
                raise TrainingDiverged(f"the encoder collapsed at step {self.worker.step} "
                                       f"(token spread {spread:.2g}): {hint}")
        return values

    def backward(self, activation: paddle.Tensor, grad: np.ndarray) -> None:
        self.model.backward(activation, grad)

    def after_training(self) -> None:
        if self.job.eval_samples and self.rank == 0:  # to tail rank 0, which scores it
            self.send_evaluation()

    def send_evaluation(self) -> None:
        """Encode ``eval_samples`` sentences drawn from the eval split (no dropout, no gradient)
        and send them as kind=eval activations; T decodes them and scores BLEU.

        A separate producer id gives them their own dedupe stream. Re-sending after a
        restart is harmless: T's per-batch results are idempotent."""
        data = load_side(self.job, self.settings.job.seed, "src", self.cfg.encoder.vocab, self.job.eval_split)
        rows = data.evaluation_rows(self.job.eval_samples)
        n = len(rows)
        size = self.job.batch_size
        batches = -(-n // size)
        codec = self.outgoing[0].schedule.codec_for(self.total)
        outbox = Outbox(self.worker, self.act_flows[0], eval_producer(self.worker_id))
        self.worker.status("running", phase=f"evaluating {n} sentences: encoding and sending them")
        self.model.eval()
        try:
            for k in range(batches):
                sample_ids, ids, mask = data.source_rows(rows[k * size:(k + 1) * size])
                with paddle.no_grad():
                    activation = self.model(ids, mask).numpy()
                outbox.send(step=self.total, micro_batch=k,
                            tensors={"enc_out": (activation, codec), "src_mask": (mask, LZ4()),
                                     "sample_ids": (sample_ids, LZ4())},
                            meta={"kind": EVAL_KIND, "batches": batches, "split": self.job.eval_split})
            outbox.flush()
        finally:
            self.model.train()
            outbox.close()
        log.info("evaluation_sent", batches=batches, samples=n)


@role(ENCODER_ROLE)
def main(settings: Settings, worker_index: int = 0) -> int:
    """``worker_index``: the encoder rank (``[abnet] encoder_ranks``)."""
    worker = AbnetEncoder.identity(settings, worker_index).broker_worker()
    return drive(worker, AbnetEncoder(settings, worker, worker_index))
