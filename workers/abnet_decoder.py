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
from nebula_mq.errors import MalformedMessage, OutOfWindow
from nebula_mq.models.abnet import DecoderSide
from nebula_mq.runtime.channel import Inbox, Outbox, Received
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.ordering import InOrderBuffer
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from nebula_mq.transport.dedup import Deduplicator
from workers.abnet_common import load_job, load_side, micro_batch_seed, model_config
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

    def restore(self) -> None:
        ck = self.store.latest()
        if ck is None:
            return
        load_state_arrays("decoder", self.model, self.optimizer, ck.arrays)
        self.step = ck.step
        self.dedupe = Deduplicator.from_state(ck.meta["dedupe"])
        log.info("resumed", step=self.step)

    def checkpoint(self) -> None:
        self.commit(state_arrays("decoder", self.model, self.optimizer),
                    {"dedupe": self.dedupe.export_state()})
        self.write_history()

    def run(self) -> int:
        self.transport.declare_dead_letter_queue()
        self.transport.declare_flow(self.act_flow, "consumer")
        self.reply_queue = self.transport.declare_flow(self.reply_flow, "producer")
        self.restore()
        outbox = Outbox(self, self.reply_flow, self.worker_id,
                        allow_non_finite=self.settings.codec.allow_non_finite)
        inbox = Inbox(self, self.act_flow, self.dedupe, held=self.checkpoint_every + self.job.in_flight,
                      allow_non_finite=self.settings.codec.allow_non_finite)
        pending: InOrderBuffer[Received] = InOrderBuffer(self.step, window=self.job.in_flight)
        try:
            while self.step < self.total and not self.stop_requested.is_set():
                t0 = time.perf_counter()
                received = inbox.get(timeout=0.5)
                self.hooks.on_wait(time.perf_counter() - t0)
                if received is None:
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

    def train_on(self, inbox: Inbox, outbox: Outbox, received: Received) -> None:
        mb = received.micro_batch
        bind_context(step=self.step, micro_batch=mb)
        t0 = time.perf_counter()
        targets = self.data.targets(received.tensors["sample_ids"])
        paddle.seed(micro_batch_seed(self.settings.job.seed, "tgt", mb))
        loss, grad = self.model.loss_and_grad(
            received.tensors["enc_out"], received.tensors["src_mask"], targets)
        self.optimizer.step()
        self.optimizer.clear_grad()
        self.hooks.on_compute(time.perf_counter() - t0)
        outbox.send(step=mb, micro_batch=mb, tensors={"grad": (grad, self.schedule.codec_for(mb))},
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
