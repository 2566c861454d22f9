"""Generic tail worker (cluster T) of a split model: consumes activations, replies with gradients.

For micro-batch ``j`` (strictly in order): look up the targets of the sample
ids the activation carries, run the tail model and the loss, back-propagate,
step the optimizer, and reply with d loss / d activation (compressed by the
backward chain). Replay and resume follow ``workers.abnet.decoder``: the reply
is confirmed before the activation is acked, the ack waits for the checkpoint
holding the step, and dropout is seeded per micro-batch, so a restarted tail
re-sends the same replies bit for bit and the head drops them as duplicates.

:class:`SplitTail` is the step, a plain role (the loop is the runtime's driver:
``nebula_mq.runtime.driver``); :class:`SpecTail` runs a user's
:class:`TailSpec`, ``workers.abnet.decoder`` the ABNet decoder (AQ-SGD mirror,
error feedback, beam-search evaluation).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping

import numpy as np

from nebula_mq.codecs import CompressionSchedule
from nebula_mq.codecs.flow import FlowCompression, Samples
from nebula_mq.errors import MalformedMessage
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.driver import Extras, StopCheck, StepInputs, drive
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from workers.registry import role
from nebula_mq.models.frameworks import Framework, framework_of, user_code
from workers.split.side import SplitSide, named_tensor_errors, peer_prefix
from workers.split.job import TAIL_ROLE, Placement, SplitJob, TailSpec, load_spec, load_split_job

log = get_logger(__name__)


class SplitTail(SplitSide):
    """The tail's step: train on the next activation, reply with its gradient. Subclasses
    say how a micro-batch is trained (:meth:`loss_and_grad`)."""

    role = TAIL_ROLE
    side = "tail"
    state_prefix = "tail"
    gradient_op = "mean"  # every tail rank trains on an equal share of the micro-batch

    def __init__(self, settings: Settings, job: Placement, worker: Worker, rank: int,
                 framework: Framework | None = None) -> None:
        super().__init__(settings, job, worker, rank, framework)
        self.act_flow = self.act_flows[rank]
        # Step s trains on the activation of micro-batch s, one piece from each head rank
        # (workers.split.shards).
        self.sources = job.head_ids() if job.head_ranks > 1 else ()
        # Per head rank: the activation flow's receiving end (the AQ-SGD mirror, when the head
        # sends deltas) and the gradient flow's sending end (schedule, rsvd warm start, error
        # feedback).
        self.incoming = [FlowCompression(CompressionSchedule.parse("none"), main=self.activation_name,
                                         role="activation", sender=False) for _ in self.reply_flows]
        self.outgoing = [FlowCompression(
            CompressionSchedule.parse(settings.codec.backward, settings.codec.compress_from_step),
            main="grad", role="gradient", feedback=self.error_feedback(),
            allow_non_finite=settings.codec.allow_non_finite) for _ in self.reply_flows]

    def inputs(self) -> StepInputs:
        return StepInputs((self.act_flow,), self.sources)

    def extras(self) -> Extras:
        return Extras(admit=self.check_reply_to)

    def compressions(self) -> tuple[tuple[str, FlowCompression], ...]:
        return tuple((peer_prefix(self.state_prefix, i), c)
                     for i, pair in enumerate(zip(self.incoming, self.outgoing)) for c in pair)

    # ------------------------------------------------------------------ what a micro-batch is

    @abstractmethod
    def loss_and_grad(self, mb: int, activation: np.ndarray, tensors: Mapping[str, np.ndarray],
                      ) -> tuple[float, np.ndarray]:
        """Loss of this rank's share of micro-batch ``mb`` (``activation`` and the message's
        other arrays, the head ranks' pieces concatenated), backward into the tail (no
        optimizer step); returns (loss, d loss / d activation)."""

    def error_feedback(self) -> bool:
        """Carry each sample's gradient compression error into its next gradient."""
        return False

    def samples(self, tensors: Mapping[str, np.ndarray]) -> Samples | None:
        """Which samples a message holds, with their lengths (delta, error feedback)."""
        return None

    # ------------------------------------------------------------------ the step (runtime.driver)

    def open(self) -> None:
        transport = self.worker.transport
        transport.declare_flow(self.act_flow, "consumer")
        self.reply_queues = [transport.declare_flow(flow, "producer") for flow in self.reply_flows]
        self.outboxes = [Outbox(self.worker, flow, self.worker_id) for flow in self.reply_flows]
        super().open()

    def produce(self, stopping: StopCheck) -> None:
        """Nothing: the tail only replies, from :meth:`apply`."""

    def check_reply_to(self, received: Received) -> None:
        """An activation must ask for its reply on its head rank's reply queue (no reply elsewhere)."""
        expected = self.reply_queues[self.peer_of(received)]
        if received.delivery.reply_to != expected:
            raise MalformedMessage(f"reply_to {received.delivery.reply_to!r} is not "
                                   f"this job's reply queue {expected!r}")

    def apply(self, parts: tuple[Received, ...]) -> dict[str, float]:
        """The worker's step ``s``: train on micro-batch ``s`` (one piece from each head rank)
        and reply to each head rank with the gradient of its piece. The replies are confirmed
        before the activations are acked (with the next checkpoint)."""
        mb = parts[0].micro_batch
        bind_context(step=self.worker.step, micro_batch=mb)
        pieces = [incoming.decode(p.tensors, p.meta, self.samples(p.tensors))  # AQ-SGD: deltas rebuilt
                  for incoming, p in zip(self.incoming, parts)]
        if len(parts) == 1:
            activation, tensors = pieces[0], parts[0].tensors
        else:
            activation = np.concatenate(pieces)
            tensors = {k: np.concatenate([p.tensors[k] for p in parts])
                       for k in parts[0].tensors if k != self.activation_name}
        loss, grad = self.loss_and_grad(mb, activation, tensors)
        if self.world > 1:
            grad = grad / np.float32(self.world)  # d(global mean loss) / d activation (routing)
        # The replies leave before the optimizer step (and the tail group's all-reduce): the
        # gradient of the activation is final once backward is done, and the head waits for it;
        # the step would only lengthen the loop that in_flight must span.
        offset = 0
        for outbox, outgoing, p, piece in zip(self.outboxes, self.outgoing, parts, pieces):
            rows = slice(offset, offset + len(piece))
            offset += len(piece)
            with named_tensor_errors(f"{self.worker_id}: the gradient of micro-batch {mb}"):
                encoded, meta = outgoing.encode(mb, {"grad": grad[rows]}, self.samples(p.tensors))
            outbox.send(step=mb, micro_batch=mb, encoded=encoded, meta={"loss": loss, **meta},
                        correlation_id=p.message_id)
        self.step_optimizer()
        return {"loss": loss, **self.baseline()}

    def baseline(self) -> dict[str, float]:
        """What a model that learnt nothing scores, recorded beside the loss (none by default)."""
        return {}


class SpecTail(SplitTail):
    """The tail of a user's model: a :class:`TailSpec`, configured by ``[split]``."""

    def __init__(self, settings: Settings, spec: TailSpec, worker: Worker, rank: int = 0) -> None:
        """``worker``: of ``SpecTail.identity(settings, rank)``."""
        self.job: SplitJob = load_split_job(settings)
        super().__init__(settings, self.job, worker, rank,
                         framework_of(spec.model, "split.tail", self.job.tail_framework, settings.source))
        self.spec = spec
        self.take_model(spec.model, spec.optimizer_fn)

    def baseline(self) -> dict[str, float]:
        return {} if self.spec.baseline is None else {"baseline": float(self.spec.baseline)}

    def loss_and_grad(self, mb: int, activation: np.ndarray, tensors: Mapping[str, np.ndarray],
                      ) -> tuple[float, np.ndarray]:
        me = self.worker_id
        with user_code(f"{me}: targets() of micro-batch {mb}"):
            targets = self.spec.targets(tensors["sample_ids"])
            parts = (targets,) if isinstance(targets, np.ndarray) else tuple(targets)
            y = [self.fw.tensor(np.asarray(t)) for t in parts]
        x = self.fw.tensor(np.asarray(activation, dtype=np.float32), grad=True)
        with self.fw.seeded(self.seed("tail", mb)):
            with user_code(f"{me}: the model's forward on micro-batch {mb}"):
                out = self.model(x)
            with user_code(f"{me}: the loss on micro-batch {mb}"):
                loss = self.spec.loss(out, *y)
        with user_code(f"{me}: the backward of micro-batch {mb}"):
            value = self.fw.loss_backward(loss, me)
        return value, self.fw.grad(x, me)


@role(TAIL_ROLE)
def main(settings: Settings, worker_index: int = 0) -> int:
    """``nebula-mq worker --role split-tail --index RANK``: the spec comes from ``[split] tail``."""
    worker = SpecTail.identity(settings, worker_index).broker_worker()
    return drive(worker, SpecTail(settings, load_spec(settings, "tail"), worker, worker_index))
