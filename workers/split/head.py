"""Generic head worker (cluster S) of a split model: activations forward, gradients back.

The schedule is ABNet's (see ``workers.abnet.encoder``): up to ``in_flight``
micro-batches wait for their gradient; gradients are applied strictly in
micro-batch order, one optimizer step each; at apply time the forward of the
micro-batch is recomputed with the current weights and the same dropout seed,
and the received gradient is back-propagated through it. So a checkpoint at
step ``c`` is all a restarted head needs, and with ``in_flight = 1`` the split
run is exactly the joint model's training.

:class:`SplitHead` is the step, a plain role (the loop is the runtime's driver:
``nebula_mq.runtime.driver``); a subclass says what a micro-batch is
(:meth:`SplitHead.forward`) and may add message fields, state (:meth:`state`) and
an after-training step: :class:`SpecHead` runs a user's :class:`HeadSpec`,
``workers.abnet.encoder`` the ABNet encoder with AQ-SGD deltas and evaluation.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nebula_mq import topology
from nebula_mq.codecs import CompressionSchedule
from nebula_mq.codecs.flow import FlowCompression, Samples
from nebula_mq.errors import MalformedMessage, ModelError, ShapeMismatch
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.checkpoint import Checkpoint
from nebula_mq.runtime.driver import Extras, StopCheck, StepInputs, drive
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import Settings
from workers.registry import role
from nebula_mq.models.frameworks import Framework, framework_of, user_code
from workers.split.side import SplitSide, named_tensor_errors, peer_prefix
from workers.split.job import HEAD_ROLE, HeadSpec, Placement, SplitJob, load_spec, load_split_job
from workers.split.shards import piece

log = get_logger(__name__)


@dataclass(frozen=True)
class Forward:
    """One micro-batch through the head."""

    sample_ids: np.ndarray  # int64 [B]: how the tail finds its targets
    activation: Any  # the framework's tensor, still holding its graph when made with grad
    # Arrays the tail needs besides the activation (e.g. a padding mask), sent lossless.
    side: Mapping[str, np.ndarray] = field(default_factory=dict)


class SplitHead(SplitSide):
    """The head's step: send activations up to the window, apply gradients in order.
    Subclasses say what a micro-batch is (:meth:`forward`)."""

    role = HEAD_ROLE
    side = "head"
    state_prefix = "head"
    gradient_op = "sum"  # each head rank holds its shard's part of the global gradient

    def __init__(self, settings: Settings, job: Placement, worker: Worker, rank: int,
                 framework: Framework | None = None) -> None:
        super().__init__(settings, job, worker, rank, framework)
        self.reply_flow = self.reply_flows[rank]
        # Step s applies the gradient of micro-batch s, one from each tail rank (workers.split.shards).
        self.sources = job.tail_ids() if job.tail_ranks > 1 else ()
        # Schedule, rsvd warm start, AQ-SGD reference, tensor roles: all of the activation
        # flow's compression state, one per tail rank, checkpointed with the head.
        self.outgoing = [FlowCompression(
            CompressionSchedule.parse(settings.codec.forward, settings.codec.compress_from_step),
            main=self.activation_name, role="activation", delta=self.delta_compression(),
            allow_non_finite=settings.codec.allow_non_finite) for _ in self.act_flows]
        self.next_fwd = 0  # next micro-batch to send; all below it are confirmed on the broker

    def inputs(self) -> StepInputs:
        return StepInputs((self.reply_flow,), self.sources)

    def extras(self) -> Extras:
        return Extras(admit=self.check_correlation, unsaved=self.unsaved)

    def compressions(self) -> tuple[tuple[str, FlowCompression], ...]:
        return tuple((peer_prefix(self.state_prefix, j), c) for j, c in enumerate(self.outgoing))

    # ------------------------------------------------------------------ what a micro-batch is

    @abstractmethod
    def forward(self, mb: int) -> Forward:
        """This rank's shard of micro-batch ``mb`` (:meth:`shard_rows`) through the model;
        deterministic in ``mb`` (dropout seeded: :meth:`seed`)."""

    def shard_rows(self, rows: int) -> slice:
        """This rank's rows of a global micro-batch of ``rows`` samples."""
        return self.ranks.shard(rows, self.rank)

    def delta_compression(self) -> bool:
        """Send activations as deltas from each sample's last reconstruction (AQ-SGD)."""
        return False

    def samples(self, fwd: Forward) -> Samples | None:
        """Which samples the activation holds, with their lengths (needed by delta compression)."""
        return None

    def message(self, mb: int, fwd: Forward, activation: np.ndarray) -> dict[str, np.ndarray]:
        """The arrays of the activation message; the flow's compression encodes them."""
        return {self.activation_name: activation, **fwd.side, "sample_ids": fwd.sample_ids}

    def backward(self, activation: Any, grad: np.ndarray) -> None:
        if tuple(grad.shape) != tuple(activation.shape):
            raise ShapeMismatch(f"{self.worker_id}: gradient shape {tuple(grad.shape)} != activation shape "
                                f"{tuple(activation.shape)}")
        self.fw.backward(activation, grad)

    # ------------------------------------------------------------------ the step (runtime.driver)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = super().state()
        return arrays, {**meta, "next_fwd": self.next_fwd}

    def load(self, ck: Checkpoint) -> None:
        super().load(ck)
        self.next_fwd = int(ck.meta["next_fwd"])

    def unsaved(self) -> bool:
        return self.next_fwd > 0  # sent activations are confirmed: remember them

    def produce(self, stopping: StopCheck) -> None:
        """Keep ``in_flight`` micro-batches waiting for their gradient."""
        while self.next_fwd < min(self.total, self.worker.step + self.in_flight) and not stopping():
            self.send_activation(self.next_fwd)
            self.next_fwd += 1

    def open(self) -> None:
        for flow in self.act_flows:
            self.worker.transport.declare_flow(flow, "producer")
        self.reply_queue = self.worker.transport.declare_flow(self.reply_flow, "consumer")
        self.outboxes = [Outbox(self.worker, flow, self.worker_id) for flow in self.act_flows]
        super().open()

    def send_activation(self, mb: int) -> None:
        """This rank's shard of ``mb``, one piece to each tail rank."""
        bind_context(step=self.worker.step, micro_batch=mb)
        with self.fw.no_grad():
            fwd = self.forward(mb)
        # Where the codec is plain fp16, the device narrows the activation before the copy:
        # half the bytes to the host, no cast there, the same message (FlowCompression.encode).
        half = self.fw.narrow_fp16(fwd.activation) if all(o.takes_fp16(mb) for o in self.outgoing) else None
        activation = half if half is not None else self.fw.numpy(fwd.activation)
        for j, (outbox, outgoing) in enumerate(zip(self.outboxes, self.outgoing)):
            rows = piece(len(fwd.sample_ids), self.ranks.tails, j)
            share = Forward(fwd.sample_ids[rows], fwd.activation, {k: v[rows] for k, v in fwd.side.items()})
            with named_tensor_errors(f"{self.worker_id}: the activation of micro-batch {mb}"):
                encoded, meta = outgoing.encode(mb, self.message(mb, share, activation[rows]), self.samples(share),
                                                narrowed=half is not None)
            outbox.send(step=mb, micro_batch=mb, encoded=encoded, meta=meta, reply_to=self.reply_queue)

    def check_correlation(self, received: Received) -> None:
        """A reply answers one request: its correlation id is the id of the activation of
        the same micro-batch this rank sent to the replying tail rank (aio-pika's RPC
        pattern); anything else is not ours to apply."""
        flow = topology.stripe_of(self.act_flows[self.peer_of(received)], received.micro_batch)
        asked = topology.message_id(self.settings.job.id, flow.name, self.worker_id, received.micro_batch)
        if received.delivery.correlation_id != asked:
            raise MalformedMessage(f"reply for micro-batch {received.micro_batch} correlates with "
                                   f"{received.delivery.correlation_id!r}, not {asked!r}")

    def apply(self, parts: tuple[Received, ...]) -> dict[str, float]:
        """The worker's step ``s``: the gradient of micro-batch ``s`` (one piece from each tail
        rank), through its recomputed forward."""
        mb = parts[0].micro_batch
        bind_context(step=self.worker.step, micro_batch=mb)
        fwd = self.forward(mb)  # recompute (module docstring)
        grad = parts[0].tensors["grad"] if len(parts) == 1 else np.concatenate([p.tensors["grad"] for p in parts])
        self.backward(fwd.activation, grad)
        self.step_optimizer()
        return self.step_values(parts, fwd)

    def step_values(self, parts: tuple[Received, ...], fwd: Forward) -> dict[str, float]:
        """What the history records for an applied step: the loss the tail computed (the mean
        over the tail ranks, each a mean over an equal share)."""
        return {"loss": float(np.mean([float(p.meta.get("loss", float("nan"))) for p in parts])),
                "samples": float(len(fwd.sample_ids) * self.world)}  # the global batch


class SpecHead(SplitHead):
    """The head of a user's model: a :class:`HeadSpec`, configured by ``[split]``."""

    def __init__(self, settings: Settings, spec: HeadSpec, worker: Worker, rank: int = 0) -> None:
        """``worker``: of ``SpecHead.identity(settings, rank)``."""
        self.job: SplitJob = load_split_job(settings)
        super().__init__(settings, self.job, worker, rank,
                         framework_of(spec.model, "split.head", self.job.head_framework, settings.source))
        self.spec = spec
        self.take_model(spec.model, spec.optimizer_fn)

    def forward(self, mb: int) -> Forward:
        me = self.worker_id
        with user_code(f"{me}: inputs({mb})"):
            parts = tuple(self.spec.inputs(mb))
        if len(parts) < 2:
            raise ModelError(f"{me}: inputs({mb}) must return (sample_ids, tensor, ...), got {len(parts)} item(s)")
        rows = self.shard_rows(len(parts[0]))
        sample_ids = np.asarray(parts[0], dtype=np.int64)[rows]
        with self.fw.seeded(self.seed("head", mb)), user_code(f"{me}: the model's forward on micro-batch {mb}"):
            out = self.model(*(self.fw.tensor(np.asarray(p)[rows]) for p in parts[1:]))
        if not self.fw.is_float_tensor(out):
            got = getattr(out, "dtype", type(out).__name__)
            raise ModelError(f"{me}: the head model must return one floating-point "
                             f"{self.fw.name} tensor, got {got}")
        return Forward(sample_ids, out)

    def backward(self, activation: Any, grad: np.ndarray) -> None:
        with user_code(f"{self.worker_id}: the model's backward on micro-batch {self.worker.step}"):
            super().backward(activation, grad)


@role(HEAD_ROLE)
def main(settings: Settings, worker_index: int = 0) -> int:
    """``nebula-mq worker --role split-head --index RANK``: the spec comes from ``[split] head``."""
    worker = SpecHead.identity(settings, worker_index).broker_worker()
    return drive(worker, SpecHead(settings, load_spec(settings, "head"), worker, worker_index))
