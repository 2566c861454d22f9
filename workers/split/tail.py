"""Generic tail worker (cluster T) of a split model: consumes activations, replies with gradients.

For micro-batch ``j`` (strictly in order): look up the targets of the sample
ids the activation carries, run the tail model and the loss, back-propagate,
step the optimizer, and reply with d loss / d activation (compressed by the
backward chain). Replay and resume follow ``workers.abnet.decoder``: the reply
is confirmed before the activation is acked, the ack waits for the checkpoint
holding the step, and dropout is seeded per micro-batch, so a restarted tail
re-sends the same replies bit for bit and the head drops them as duplicates.

:class:`SplitTail` is the loop; :class:`SplitTailWorker` runs a user's
:class:`TailSpec`, ``workers.abnet.decoder`` the ABNet decoder (AQ-SGD mirror,
error feedback, beam-search evaluation).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle

from nebula_mq import topology
from nebula_mq.codecs import CompressionSchedule
from nebula_mq.codecs.flow import FlowCompression, Samples
from nebula_mq.errors import DataError, MalformedMessage
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.ordered import OrderedInbox
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from nebula_mq.transport.dedup import Deduplicator
from nebula_mq.models.state import load_state_arrays, state_arrays
from workers.registry import role
from workers.split.head import StepEnd, trainable
from workers.split.job import SplitJob, TailSpec, load_builder, load_split_job, micro_batch_seed

log = get_logger(__name__)


class SplitTail(StepEnd):
    """The tail loop; subclasses say how a micro-batch is trained (:meth:`loss_and_grad`)."""

    role = "split-tail"
    state_prefix = "tail"  # names this side's arrays in the checkpoint
    activation_name = "activation"  # tensor name of the activation in the message

    def __init__(self, settings: Settings, cluster: str, worker_id: str, transport: Transport | None, *,
                 flows: tuple[topology.Flow, topology.Flow], in_flight: int, checkpoint_every: int) -> None:
        super().__init__(settings, cluster, worker_id, transport, checkpoint_every=checkpoint_every)
        self.act_flow, self.reply_flow = flows
        self.in_flight = in_flight
        # The activation flow's receiving end (the AQ-SGD mirror, when the head sends deltas)
        # and the gradient flow's sending end (schedule, rsvd warm start, error feedback).
        self.incoming = FlowCompression(CompressionSchedule.parse("none"), main=self.activation_name,
                                        role="activation", sender=False)
        self.outgoing = FlowCompression(
            CompressionSchedule.parse(settings.codec.backward, settings.codec.compress_from_step),
            main="grad", role="gradient", feedback=self.error_feedback(),
            allow_non_finite=settings.codec.allow_non_finite)
        self.dedupe = Deduplicator()
        self.total = settings.job.steps
        self.model: paddle.nn.Layer
        self.optimizer: paddle.optimizer.Optimizer

    # ------------------------------------------------------------------ what a micro-batch is

    @abstractmethod
    def loss_and_grad(self, mb: int, received: Received) -> tuple[float, np.ndarray]:
        """Loss of the received activation, backward into the tail (no optimizer step);
        returns (loss, d loss / d activation)."""

    def error_feedback(self) -> bool:
        """Carry each sample's gradient compression error into its next gradient."""
        return False

    def samples(self, received: Received) -> Samples | None:
        """Which samples the activation holds, with their lengths (delta, error feedback)."""
        return None

    def activation(self, received: Received) -> np.ndarray:
        """The received activation as the head meant it (a delta rebuilt on the mirror)."""
        return self.incoming.decode(received.tensors, received.meta, self.samples(received))

    def handle_other(self, inbox: OrderedInbox, received: Received) -> bool:
        """True when ``received`` is not a training activation and was dealt with here."""
        return False

    def more_to_do(self) -> bool:
        """Keep consuming after the last training step (e.g. evaluation batches)."""
        return False

    def extra_state(self) -> dict[str, np.ndarray]:
        return {}

    def restore_extra(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        return None

    # ------------------------------------------------------------------ checkpoint

    def restore(self) -> None:
        ck = self.store.latest()
        if ck is None:
            return
        load_state_arrays(self.state_prefix, self.model, self.optimizer, ck.arrays)
        self.step = ck.step
        self.dedupe = Deduplicator.from_state(ck.meta["dedupe"])
        self.incoming.restore(ck.arrays, self.state_prefix)
        self.outgoing.restore(ck.arrays, self.state_prefix)
        self.restore_extra(ck.arrays, ck.meta)
        log.info("resumed", step=self.step)

    def checkpoint(self) -> None:
        arrays = state_arrays(self.state_prefix, self.model, self.optimizer)
        arrays.update(self.incoming.state_arrays(self.state_prefix))
        arrays.update(self.outgoing.state_arrays(self.state_prefix))
        arrays.update(self.extra_state())
        self.commit(arrays, {"dedupe": self.dedupe.export_state()})
        self.write_history()

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        self.transport.declare_dead_letter_queue()
        self.transport.declare_flow(self.act_flow, "consumer")
        self.reply_queue = self.transport.declare_flow(self.reply_flow, "producer")
        self.restore()
        outbox = Outbox(self, self.reply_flow, self.worker_id)
        inbox = OrderedInbox(self, self.act_flow, self.dedupe, self.step, self.window())
        try:
            while (self.step < self.total or self.more_to_do()) and not self.stop_requested.is_set():
                received = inbox.next(timeout=0.5)
                if received is None or self.handle_other(inbox, received):
                    continue
                for ready in inbox.take(received, admit=self.check_reply_to):
                    self.train_on(inbox, outbox, ready)
            if self.step > 0 and not self.has_checkpoint_at_step():
                self.checkpoint()
        finally:
            outbox.close()
            inbox.close()
        return 0

    def check_reply_to(self, received: Received) -> None:
        """An activation must ask for its reply on this job's reply queue (no reply elsewhere)."""
        if received.delivery.reply_to != self.reply_queue:
            raise MalformedMessage(f"reply_to {received.delivery.reply_to!r} is not "
                                   f"this job's reply queue {self.reply_queue!r}")

    def train_on(self, inbox: OrderedInbox, outbox: Outbox, received: Received) -> None:
        mb = received.micro_batch
        bind_context(step=self.step, micro_batch=mb)
        t0 = time.perf_counter()
        loss, grad = self.loss_and_grad(mb, received)
        self.step_optimizer()
        self.hooks.on_compute(time.perf_counter() - t0)
        encoded, meta = self.outgoing.encode(mb, {"grad": grad}, self.samples(received))
        outbox.send(step=mb, micro_batch=mb, encoded=encoded, meta={"loss": loss, **meta},
                    correlation_id=received.message_id)
        self.finish_step(inbox, received, {"loss": loss})


class SplitTailWorker(SplitTail):
    """The tail of a user's model: a :class:`TailSpec`, configured by ``[split]``."""

    def __init__(self, settings: Settings, spec: TailSpec, transport: Transport | None = None) -> None:
        self.job: SplitJob = load_split_job(settings)
        super().__init__(settings, self.job.tail_cluster, self.job.tail_id, transport, flows=self.job.flows(),
                         in_flight=self.job.in_flight, checkpoint_every=self.job.checkpoint_every)
        self.spec = spec
        self.model = spec.model
        self.optimizer = spec.optimizer_fn(trainable(self.model), self.job.lr)

    def loss_and_grad(self, mb: int, received: Received) -> tuple[float, np.ndarray]:
        targets = self.spec.targets(received.tensors["sample_ids"])
        parts = (targets,) if isinstance(targets, np.ndarray) else tuple(targets)
        x = paddle.to_tensor(np.asarray(self.activation(received), dtype=np.float32), stop_gradient=False)
        paddle.seed(micro_batch_seed(self.settings.job.seed, "tail", mb))
        loss = self.spec.loss(self.model(x), *(paddle.to_tensor(np.asarray(t)) for t in parts))
        if not isinstance(loss, paddle.Tensor) or loss.size != 1:
            raise DataError("the tail loss must return a scalar tensor")
        loss.backward()
        assert x.grad is not None  # x requires a gradient and the loss depends on it
        return float(loss), x.grad.numpy()


@role("split-tail")
def main(settings: Settings) -> int:
    """``nebula-mq worker --role split-tail``: the spec comes from ``[split] tail``."""
    spec = load_builder(settings, "tail")(settings)
    if not isinstance(spec, TailSpec):
        from nebula_mq.errors import ConfigError

        raise ConfigError(settings.source, "split.tail", "a function returning TailSpec", type(spec).__name__)
    worker = SplitTailWorker(settings, spec)
    worker.install_signal_handlers()
    return worker.main()
