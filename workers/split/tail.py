"""Generic tail worker (cluster T) of a split model: consumes activations, replies with gradients.

For micro-batch ``j`` (strictly in order): look up the targets of the sample
ids the activation carries, run the tail model and the loss, back-propagate,
step the optimizer, and reply with d loss / d activation (compressed by the
backward chain). Replay and resume follow ``workers.abnet.decoder``: the reply
is confirmed before the activation is acked, the ack waits for the checkpoint
holding the step, and dropout is seeded per micro-batch, so a restarted tail
re-sends the same replies bit for bit and the head drops them as duplicates.

:class:`SplitTail` is the step (the loop is the runtime's: ``nebula_mq.runtime.stepped``);
:class:`SplitTailWorker` runs a user's
:class:`TailSpec`, ``workers.abnet.decoder`` the ABNet decoder (AQ-SGD mirror,
error feedback, beam-search evaluation).
"""

from __future__ import annotations

import time
from abc import abstractmethod

import numpy as np
import paddle

from nebula_mq import topology
from nebula_mq.codecs import CompressionSchedule
from nebula_mq.codecs.flow import FlowCompression, Samples
from nebula_mq.errors import DataError, MalformedMessage
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from workers.registry import role
from workers.split.side import SplitSide, trainable
from workers.split.job import SplitJob, TailSpec, load_builder, load_split_job, micro_batch_seed

log = get_logger(__name__)


class SplitTail(SplitSide):
    """The tail's step: train on the next activation, reply with its gradient. Subclasses
    say how a micro-batch is trained (:meth:`loss_and_grad`)."""

    role = "split-tail"
    state_prefix = "tail"

    def __init__(self, settings: Settings, cluster: str, worker_id: str, transport: Transport | None, *,
                 flows: tuple[topology.Flow, topology.Flow], in_flight: int, checkpoint_every: int) -> None:
        super().__init__(settings, cluster, worker_id, transport, flows=flows, in_flight=in_flight,
                         checkpoint_every=checkpoint_every)
        self.steps_flow = self.act_flow  # step s trains on the activation of micro-batch s
        # The activation flow's receiving end (the AQ-SGD mirror, when the head sends deltas)
        # and the gradient flow's sending end (schedule, rsvd warm start, error feedback).
        self.incoming = FlowCompression(CompressionSchedule.parse("none"), main=self.activation_name,
                                        role="activation", sender=False)
        self.outgoing = FlowCompression(
            CompressionSchedule.parse(settings.codec.backward, settings.codec.compress_from_step),
            main="grad", role="gradient", feedback=self.error_feedback(),
            allow_non_finite=settings.codec.allow_non_finite)

    def compressions(self) -> tuple[FlowCompression, ...]:
        return (self.incoming, self.outgoing)

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

    # ------------------------------------------------------------------ the step (runtime.stepped)

    def open(self) -> None:
        self.transport.declare_flow(self.act_flow, "consumer")
        self.reply_queue = self.transport.declare_flow(self.reply_flow, "producer")
        self.outbox = Outbox(self, self.reply_flow, self.worker_id)

    def close(self) -> None:
        self.outbox.close()

    def admit(self, received: Received) -> None:
        self.check_reply_to(received)

    def check_reply_to(self, received: Received) -> None:
        """An activation must ask for its reply on this job's reply queue (no reply elsewhere)."""
        if received.delivery.reply_to != self.reply_queue:
            raise MalformedMessage(f"reply_to {received.delivery.reply_to!r} is not "
                                   f"this job's reply queue {self.reply_queue!r}")

    def apply(self, received: Received) -> dict[str, float]:
        """Step ``self.step``: train on micro-batch ``self.step`` and reply with its gradient. The
        reply is confirmed before the activation is acked (with the next checkpoint)."""
        mb = received.micro_batch
        bind_context(step=self.step, micro_batch=mb)
        t0 = time.perf_counter()
        loss, grad = self.loss_and_grad(mb, received)
        self.step_optimizer()
        self.hooks.on_compute(time.perf_counter() - t0)
        encoded, meta = self.outgoing.encode(mb, {"grad": grad}, self.samples(received))
        self.outbox.send(step=mb, micro_batch=mb, encoded=encoded, meta={"loss": loss, **meta},
                         correlation_id=received.message_id)
        return {"loss": loss}


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
