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

import time

import paddle

from nebula_mq.codecs import CompressionSchedule
from nebula_mq.codecs.feedback import DeltaCompression, ErrorFeedback, SampleRows
from nebula_mq.errors import MalformedMessage, OutOfWindow
from nebula_mq.models.abnet import DecoderSide
from nebula_mq.runtime.channel import Inbox, Outbox, Received
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.ordering import InOrderBuffer
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from nebula_mq.transport.dedup import Deduplicator
from workers.abnet_common import EVAL_KIND, load_job, load_side, micro_batch_seed, model_config, sample_lengths
from workers.abnet_eval import Evaluation
from workers.paddle_state import load_state_arrays, state_arrays

log = get_logger(__name__)


class AbnetDecoderWorker(Worker):
    role = "abnet-decoder"

    def __init__(self, settings: Settings, transport: Transport | None = None,
                 worker_id: str = "dec-0") -> None:
        self.job = load_job(settings)
        super().__init__(settings, self.job.tgt_cluster, worker_id, transport,
                         checkpoint_every=self.job.checkpoint_every)
        self.cfg = model_config(self.job, settings.job.seed)
        self.model = DecoderSide(self.cfg)
        self.optimizer = paddle.optimizer.AdamW(
            learning_rate=self.job.lr, parameters=self.model.trainable_parameters(), weight_decay=0.0)
        self.data = load_side(self.job, settings.job.seed, "tgt", self.cfg.decoder.vocab)
        self.act_flow, self.reply_flow = self.job.flows()
        self.schedule = CompressionSchedule.parse(settings.codec.backward, settings.codec.compress_from_step)
        self.dedupe = Deduplicator()
        self.total = settings.job.steps
        # Mirror of the encoder's AQ-SGD cache (created on demand: the sender decides).
        self.delta = DeltaCompression()
        # Per-sample residual of the gradient codec (error feedback), sender-side state.
        self.feedback = ErrorFeedback() if self.job.backward_feedback == "residual" else None
        self.evaluation = Evaluation(self.job, settings.job.seed, self.cfg.decoder.vocab,
                                     settings.run_dir, worker_id)

    def restore(self) -> None:
        ck = self.store.latest()
        if ck is None:
            return
        load_state_arrays("decoder", self.model, self.optimizer, ck.arrays)
        self.step = ck.step
        self.dedupe = Deduplicator.from_state(ck.meta["dedupe"])
        self.delta = DeltaCompression(SampleRows.restore(ck.arrays, "decoder/delta"))
        if self.feedback is not None:
            self.feedback = ErrorFeedback(SampleRows.restore(ck.arrays, "decoder/feedback"))
        log.info("resumed", step=self.step)

    def checkpoint(self) -> None:
        arrays = state_arrays("decoder", self.model, self.optimizer)
        if len(self.delta.cache):
            arrays.update(self.delta.cache.export("decoder/delta"))
        if self.feedback is not None:
            arrays.update(self.feedback.residual.export("decoder/feedback"))
        self.commit(arrays, {"dedupe": self.dedupe.export_state()})
        self.write_history()

    def run(self) -> int:
        self.transport.declare_dead_letter_queue()
        self.transport.declare_flow(self.act_flow, "consumer")
        self.reply_queue = self.transport.declare_flow(self.reply_flow, "producer")
        self.restore()
        outbox = Outbox(self, self.reply_flow, self.worker_id,
                        allow_non_finite=self.settings.codec.allow_non_finite)
        inbox = Inbox(self, self.act_flow, self.dedupe, held=2 * self.checkpoint_every + self.job.in_flight,
                      allow_non_finite=self.settings.codec.allow_non_finite)
        # A peer may be ahead of our last checkpoint by what we applied but had not
        # checkpointed when we stopped (< checkpoint_every) plus its window; anything
        # further cannot come from an honest peer and is dead-lettered.
        pending: InOrderBuffer[Received] = InOrderBuffer(
            self.step, window=self.job.in_flight + self.checkpoint_every)
        try:
            while ((self.step < self.total or not self.evaluation.done)
                   and not self.stop_requested.is_set()):
                t0 = time.perf_counter()
                received = inbox.get(timeout=0.5)
                self.hooks.on_wait(time.perf_counter() - t0)
                if received is None:
                    continue
                if received.meta.get("kind") == EVAL_KIND:
                    self.evaluate(inbox, received)
                    continue
                if pending.is_duplicate(received.micro_batch):
                    inbox.discard_duplicate(received)
                    continue
                try:
                    if received.delivery.reply_to != self.reply_queue:
                        raise MalformedMessage(f"reply_to {received.delivery.reply_to!r} is not "
                                               f"this job's reply queue {self.reply_queue!r}")
                    pending.push(received.micro_batch, received)
                except (OutOfWindow, MalformedMessage) as exc:
                    inbox.reject(received, exc)
                    continue
                for ready in pending.pop_ready():
                    self.train_on(inbox, outbox, ready.item)
            # Normal end or SIGTERM: what was applied is checkpointed and acked.
            # On an exception nothing is committed; the broker replays the rest.
            if self.step > 0 and not self.has_checkpoint_at_step():
                self.checkpoint()
        finally:
            outbox.close()
            inbox.close()
        return 0

    def evaluate(self, inbox: Inbox, received: Received) -> None:
        """A kind=eval activation: decode, store, ack at once (re-doing it is idempotent)."""
        t = received.tensors
        try:
            self.evaluation.on_batch(self.model, received.micro_batch, int(received.meta.get("batches", 0)),
                                     t["enc_out"], t["src_mask"], t["sample_ids"])
        except MalformedMessage as exc:
            inbox.reject(received, exc)
            return
        received.delivery.ack()

    def train_on(self, inbox: Inbox, outbox: Outbox, received: Received) -> None:
        mb = received.micro_batch
        bind_context(step=self.step, micro_batch=mb)
        t0 = time.perf_counter()
        sample_ids, mask = received.tensors["sample_ids"], received.tensors["src_mask"]
        targets = self.data.targets(sample_ids)
        enc_out = received.tensors["enc_out"]
        if received.meta.get("delta"):  # AQ-SGD: the message holds the change (see feedback.py)
            enc_out = self.delta.reconstruct(sample_ids, sample_lengths(mask), enc_out)
        paddle.seed(micro_batch_seed(self.settings.job.seed, "tgt", mb))
        loss, grad = self.model.loss_and_grad(enc_out, mask, targets)
        self.optimizer.step()
        self.optimizer.clear_grad()
        codec = self.schedule.codec_for(mb)
        if self.feedback is not None:
            grad = self.feedback.compensate(sample_ids, sample_lengths(mask), grad, codec)
        self.hooks.on_compute(time.perf_counter() - t0)
        outbox.send(step=mb, micro_batch=mb, tensors={"grad": (grad, codec)},
                    meta={"loss": loss}, correlation_id=received.message_id)
        self.step += 1
        inbox.applied(received)
        self.record_step({"loss": loss})
        if self.step % self.checkpoint_every == 0 or self.step == self.total:
            self.checkpoint()


def main(settings: Settings) -> int:
    worker = AbnetDecoderWorker(settings)
    worker.install_signal_handlers()
    return worker.main()
