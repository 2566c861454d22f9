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

import time
import numpy as np
import paddle

from nebula_mq.codecs import LZ4, CompressionSchedule, LowRankState
from nebula_mq.codecs.feedback import DeltaCompression, SampleRows
from nebula_mq.errors import OutOfWindow
from nebula_mq.models.abnet import EncoderSide
from nebula_mq.runtime.channel import Inbox, Outbox, Received
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.ordering import InOrderBuffer
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from nebula_mq.transport.dedup import Deduplicator
from workers.abnet_common import (EVAL_KIND, eval_producer, load_job, load_side, micro_batch_seed,
                                  model_config, sample_lengths, source_keep_ids)
from workers.paddle_state import load_state_arrays, state_arrays

log = get_logger(__name__)


class AbnetEncoderWorker(Worker):
    role = "abnet-encoder"

    def __init__(self, settings: Settings, transport: Transport | None = None) -> None:
        self.job = load_job(settings)
        super().__init__(settings, self.job.src_cluster, self.job.encoder_id, transport,
                         checkpoint_every=self.job.checkpoint_every)
        self.cfg = model_config(self.job, settings.job.seed)
        self.model = EncoderSide(self.cfg, source_keep_ids(self.job))
        self.optimizer = paddle.optimizer.AdamW(
            learning_rate=self.job.lr, parameters=self.model.trainable_parameters(), weight_decay=0.0)
        self.data = load_side(self.job, settings.job.seed, "src", self.cfg.encoder.vocab)
        self.act_flow, self.reply_flow = self.job.flows()
        self.schedule = CompressionSchedule.parse(settings.codec.forward, settings.codec.compress_from_step)
        self.lowrank = LowRankState()  # warm start of rsvd: sender-side state
        # AQ-SGD reference per sample; mirrored on T, part of the checkpoint.
        self.delta = DeltaCompression() if self.job.forward_feedback == "delta" else None
        self.dedupe = Deduplicator()
        self.next_fwd = 0  # next micro-batch to send; all below it are confirmed on the broker
        self.total = settings.job.steps

    # ------------------------------------------------------------------ checkpoint

    def restore(self) -> None:
        ck = self.store.latest()
        if ck is None:
            return
        load_state_arrays("encoder", self.model, self.optimizer, ck.arrays)
        self.step = ck.step
        self.next_fwd = int(ck.meta["next_fwd"])
        self.dedupe = Deduplicator.from_state(ck.meta["dedupe"])
        if self.delta is not None:
            self.delta = DeltaCompression(SampleRows.restore(ck.arrays, "encoder/delta"))
        log.info("resumed", step=self.step, next_fwd=self.next_fwd)

    def checkpoint(self) -> None:
        arrays = state_arrays("encoder", self.model, self.optimizer)
        if self.delta is not None:
            arrays.update(self.delta.cache.export("encoder/delta"))
        self.commit(arrays, {"next_fwd": self.next_fwd, "dedupe": self.dedupe.export_state()})
        self.write_history()

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        self.transport.declare_dead_letter_queue()
        self.transport.declare_flow(self.act_flow, "producer")
        reply_queue = self.transport.declare_flow(self.reply_flow, "consumer")
        self.restore()
        outbox = Outbox(self, self.act_flow, self.worker_id, allow_non_finite=self.settings.codec.allow_non_finite)
        inbox = Inbox(self, self.reply_flow, self.dedupe, held=2 * self.checkpoint_every + self.job.in_flight,
                      allow_non_finite=self.settings.codec.allow_non_finite)
        # A peer may be ahead of our last checkpoint by what we applied but had not
        # checkpointed when we stopped (< checkpoint_every) plus its window; anything
        # further cannot come from an honest peer and is dead-lettered.
        pending: InOrderBuffer[Received] = InOrderBuffer(
            self.step, window=self.job.in_flight + self.checkpoint_every)
        window = self.job.in_flight
        try:
            while self.step < self.total:
                while self.next_fwd < min(self.total, self.step + window) and not self.stop_requested.is_set():
                    self.send_activation(outbox, self.next_fwd, reply_queue)
                    self.next_fwd += 1
                if self.stop_requested.is_set():
                    break
                t0 = time.perf_counter()
                received = inbox.get(timeout=0.5)
                self.hooks.on_wait(time.perf_counter() - t0)
                if received is None:
                    continue
                if pending.is_duplicate(received.micro_batch):
                    inbox.discard_duplicate(received)
                    continue
                try:
                    pending.push(received.micro_batch, received)
                except OutOfWindow as exc:
                    inbox.reject(received, exc)
                    continue
                for ready in pending.pop_ready():
                    self.apply_gradient(inbox, ready.item)
            # Normal end or SIGTERM: what was applied is checkpointed and acked.
            # On an exception nothing is committed; the broker replays the rest.
            if (self.step > 0 or self.next_fwd > 0) and not self.has_checkpoint_at_step():
                self.checkpoint()
            if self.step >= self.total and self.job.eval_samples and not self.stop_requested.is_set():
                self.send_evaluation()
        finally:
            outbox.close()
            inbox.close()
        return 0

    def _forward(self, mb: int) -> tuple[np.ndarray, np.ndarray, paddle.Tensor]:
        sample_ids, ids, mask = self.data.source(mb)
        paddle.seed(micro_batch_seed(self.settings.job.seed, "src", mb))
        return sample_ids, mask, self.model(ids, mask)

    def send_activation(self, outbox: Outbox, mb: int, reply_queue: str) -> None:
        bind_context(step=self.step, micro_batch=mb)
        t0 = time.perf_counter()
        with paddle.no_grad():
            sample_ids, mask, enc_out = self._forward(mb)
        activation = enc_out.numpy()
        self.hooks.on_compute(time.perf_counter() - t0)
        codec = self.schedule.codec_for(mb)
        meta: dict[str, object] = {}
        state: LowRankState | None = self.lowrank
        if self.delta is not None:
            # The cache update needs the receiver's exact decode, so no warm-start state
            # (an rsvd encode would then differ between the local and the sent copy).
            activation = self.delta.send(sample_ids, sample_lengths(mask), activation, codec)
            meta["delta"] = True
            state = None
        outbox.send(
            step=mb, micro_batch=mb,
            tensors={"enc_out": (activation, codec), "src_mask": (mask, LZ4()),
                     "sample_ids": (sample_ids, LZ4())},
            meta=meta, reply_to=reply_queue, state=state,
        )

    def send_evaluation(self) -> None:
        """Encode the first ``eval_samples`` of the eval split (no dropout, no gradient)
        and send them as kind=eval activations; T decodes them and scores BLEU.

        A separate producer id gives them their own dedupe stream. Re-sending after a
        restart is harmless: T's per-batch results are idempotent."""
        data = load_side(self.job, self.settings.job.seed, "src", self.cfg.encoder.vocab, self.job.eval_split)
        n = min(self.job.eval_samples, data.n)
        size = self.job.batch_size
        batches = -(-n // size)
        codec = self.schedule.codec_for(self.total)
        outbox = Outbox(self, self.act_flow, eval_producer(self.worker_id),
                        allow_non_finite=self.settings.codec.allow_non_finite)
        self.model.eval()
        try:
            for k in range(batches):
                sample_ids, ids, mask = data.source_rows(np.arange(k * size, min(n, (k + 1) * size)))
                with paddle.no_grad():
                    activation = self.model(ids, mask).numpy()
                outbox.send(step=self.total, micro_batch=k,
                            tensors={"enc_out": (activation, codec), "src_mask": (mask, LZ4()),
                                     "sample_ids": (sample_ids, LZ4())},
                            meta={"kind": EVAL_KIND, "batches": batches, "split": self.job.eval_split})
        finally:
            self.model.train()
            outbox.close()
        log.info("evaluation_sent", batches=batches, samples=n)

    def apply_gradient(self, inbox: Inbox, received: Received) -> None:
        mb = received.micro_batch
        bind_context(step=self.step, micro_batch=mb)
        t0 = time.perf_counter()
        _, _, enc_out = self._forward(mb)  # recompute (module docstring)
        self.model.backward(enc_out, received.tensors["grad"])
        self.optimizer.step()
        self.optimizer.clear_grad()
        self.hooks.on_compute(time.perf_counter() - t0)
        self.step += 1
        inbox.applied(received)
        self.record_step({"loss": float(received.meta.get("loss", float("nan")))})
        if self.step % self.checkpoint_every == 0 or self.step == self.total:
            self.checkpoint()


def main(settings: Settings) -> int:
    worker = AbnetEncoderWorker(settings)
    worker.install_signal_handlers()
    return worker.main()
