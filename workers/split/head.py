"""Generic head worker (cluster S) of a split model: activations forward, gradients back.

The schedule is ABNet's (see ``workers.abnet.encoder``): up to ``in_flight``
micro-batches wait for their gradient; gradients are applied strictly in
micro-batch order, one optimizer step each; at apply time the forward of the
micro-batch is recomputed with the current weights and the same dropout seed,
and the received gradient is back-propagated through it. So a checkpoint at
step ``c`` is all a restarted head needs, and with ``in_flight = 1`` the split
run is exactly the joint model's training.

:class:`SplitHead` is the step (the loop is the runtime's:
``nebula_mq.runtime.stepped``); a subclass says what a micro-batch is
(:meth:`SplitHead.forward`) and may add message fields, state (:meth:`state`) and
an after-training step: :class:`SplitHeadWorker` runs a user's :class:`HeadSpec`,
``workers.abnet.encoder`` the ABNet encoder with AQ-SGD deltas and evaluation.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import paddle

from nebula_mq import topology
from nebula_mq.codecs import CompressionSchedule
from nebula_mq.codecs.flow import FlowCompression, Samples
from nebula_mq.errors import DataError, MalformedMessage, ShapeMismatch
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.checkpoint import Checkpoint
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from workers.registry import role
from workers.split.side import SplitSide, trainable
from workers.split.job import HeadSpec, SplitJob, load_builder, load_split_job, micro_batch_seed

log = get_logger(__name__)


@dataclass(frozen=True)
class Forward:
    """One micro-batch through the head."""

    sample_ids: np.ndarray  # int64 [B]: how the tail finds its targets
    activation: paddle.Tensor
    # Arrays the tail needs besides the activation (e.g. a padding mask), sent lossless.
    side: Mapping[str, np.ndarray] = field(default_factory=dict)


class SplitHead(SplitSide):
    """The head's step: send activations up to the window, apply gradients in order.
    Subclasses say what a micro-batch is (:meth:`forward`)."""

    role = "split-head"
    state_prefix = "head"

    def __init__(self, settings: Settings, cluster: str, worker_id: str, transport: Transport | None, *,
                 flows: tuple[topology.Flow, topology.Flow], in_flight: int, checkpoint_every: int) -> None:
        super().__init__(settings, cluster, worker_id, transport, flows=flows, in_flight=in_flight,
                         checkpoint_every=checkpoint_every)
        self.steps_flow = self.reply_flow  # step s applies the gradient of micro-batch s
        # Schedule, rsvd warm start, AQ-SGD reference, tensor roles: all of the activation
        # flow's compression state, checkpointed with the head.
        self.outgoing = FlowCompression(
            CompressionSchedule.parse(settings.codec.forward, settings.codec.compress_from_step),
            main=self.activation_name, role="activation", delta=self.delta_compression(),
            allow_non_finite=settings.codec.allow_non_finite)
        self.next_fwd = 0  # next micro-batch to send; all below it are confirmed on the broker

    def compressions(self) -> tuple[FlowCompression, ...]:
        return (self.outgoing,)

    # ------------------------------------------------------------------ what a micro-batch is

    @abstractmethod
    def forward(self, mb: int) -> Forward:
        """Micro-batch ``mb`` through the model; deterministic in ``mb`` (dropout seeded)."""

    def delta_compression(self) -> bool:
        """Send activations as deltas from each sample's last reconstruction (AQ-SGD)."""
        return False

    def samples(self, fwd: Forward) -> Samples | None:
        """Which samples the activation holds, with their lengths (needed by delta compression)."""
        return None

    def message(self, mb: int, fwd: Forward, activation: np.ndarray) -> dict[str, np.ndarray]:
        """The arrays of the activation message; the flow's compression encodes them."""
        return {self.activation_name: activation, **fwd.side, "sample_ids": fwd.sample_ids}

    def backward(self, activation: paddle.Tensor, grad: np.ndarray) -> None:
        if tuple(grad.shape) != tuple(activation.shape):
            raise ShapeMismatch(f"gradient shape {tuple(grad.shape)} != activation shape {tuple(activation.shape)}")
        activation.backward(paddle.to_tensor(np.asarray(grad, dtype=np.float32)))

    # ------------------------------------------------------------------ the step (runtime.stepped)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = super().state()
        return arrays, {**meta, "next_fwd": self.next_fwd}

    def load(self, ck: Checkpoint) -> None:
        super().load(ck)
        self.next_fwd = int(ck.meta["next_fwd"])

    def unsaved(self) -> bool:
        return self.step > 0 or self.next_fwd > 0  # sent activations are confirmed: remember them

    def produce(self) -> None:
        """Keep ``in_flight`` micro-batches waiting for their gradient."""
        while self.next_fwd < min(self.total, self.step + self.in_flight) and not self.stop_requested.is_set():
            self.send_activation(self.next_fwd)
            self.next_fwd += 1

    def open(self) -> None:
        self.transport.declare_flow(self.act_flow, "producer")
        self.reply_queue = self.transport.declare_flow(self.reply_flow, "consumer")
        self.outbox = Outbox(self, self.act_flow, self.worker_id)

    def close(self) -> None:
        self.outbox.close()

    def send_activation(self, mb: int) -> None:
        bind_context(step=self.step, micro_batch=mb)
        t0 = time.perf_counter()
        with paddle.no_grad():
            fwd = self.forward(mb)
        activation = fwd.activation.numpy()
        self.hooks.on_compute(time.perf_counter() - t0)
        encoded, meta = self.outgoing.encode(mb, self.message(mb, fwd, activation), self.samples(fwd))
        self.outbox.send(step=mb, micro_batch=mb, encoded=encoded, meta=meta, reply_to=self.reply_queue)

    def admit(self, received: Received) -> None:
        self.check_correlation(received)

    def check_correlation(self, received: Received) -> None:
        """A reply answers one request: its correlation id is the id of the activation of
        the same micro-batch (aio-pika's RPC pattern); anything else is not ours to apply."""
        asked = topology.message_id(self.settings.job.id, self.act_flow.name, self.worker_id, received.micro_batch)
        if received.delivery.correlation_id != asked:
            raise MalformedMessage(f"reply for micro-batch {received.micro_batch} correlates with "
                                   f"{received.delivery.correlation_id!r}, not {asked!r}")

    def apply(self, received: Received) -> dict[str, float]:
        """Step ``self.step``: the gradient of micro-batch ``self.step``, through its recomputed forward."""
        mb = received.micro_batch
        bind_context(step=self.step, micro_batch=mb)
        t0 = time.perf_counter()
        fwd = self.forward(mb)  # recompute (module docstring)
        self.backward(fwd.activation, received.tensors["grad"])
        self.step_optimizer()
        self.hooks.on_compute(time.perf_counter() - t0)
        return self.step_values(received, fwd)

    def step_values(self, received: Received, fwd: Forward) -> dict[str, float]:
        """What the history records for an applied step (the loss the tail computed)."""
        return {"loss": float(received.meta.get("loss", float("nan")))}


class SplitHeadWorker(SplitHead):
    """The head of a user's model: a :class:`HeadSpec`, configured by ``[split]``."""

    def __init__(self, settings: Settings, spec: HeadSpec, transport: Transport | None = None) -> None:
        self.job: SplitJob = load_split_job(settings)
        super().__init__(settings, self.job.head_cluster, self.job.head_id, transport, flows=self.job.flows(),
                         in_flight=self.job.in_flight, checkpoint_every=self.job.checkpoint_every)
        self.spec = spec
        self.model = spec.model
        self.optimizer = spec.optimizer_fn(trainable(self.model), self.job.lr)

    def forward(self, mb: int) -> Forward:
        parts = tuple(self.spec.inputs(mb))
        if len(parts) < 2:
            raise DataError(f"inputs({mb}) must return (sample_ids, tensor, ...), got {len(parts)} item(s)")
        sample_ids = np.asarray(parts[0], dtype=np.int64)
        paddle.seed(micro_batch_seed(self.settings.job.seed, "head", mb))
        out = self.model(*(paddle.to_tensor(np.asarray(p)) for p in parts[1:]))
        if not isinstance(out, paddle.Tensor):
            raise DataError(f"the head model must return one tensor, got {type(out).__name__}")
        return Forward(sample_ids, out)


@role("split-head")
def main(settings: Settings) -> int:
    """``nebula-mq worker --role split-head``: the spec comes from ``[split] head``."""
    spec = load_builder(settings, "head")(settings)
    if not isinstance(spec, HeadSpec):
        from nebula_mq.errors import ConfigError

        raise ConfigError(settings.source, "split.head", "a function returning HeadSpec", type(spec).__name__)
    worker = SplitHeadWorker(settings, spec)
    worker.install_signal_handlers()
    return worker.main()
