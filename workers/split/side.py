"""What both sides of a split model share: flows, model, optimizer and their checkpoint.

The loop, the ordering, the acks and the checkpoint schedule belong to the runtime
(:class:`~nebula_mq.runtime.stepped.SteppedWorker`); the head and the tail
(``workers.split.head``, ``workers.split.tail``) say what one step does. This is
the state they both keep: the model's trainable weights and the optimizer, the
learning-rate schedule, and each flow's compression state
(:class:`~nebula_mq.codecs.flow.FlowCompression`), saved and restored together.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np
import paddle

from nebula_mq import topology
from nebula_mq.codecs.flow import FlowCompression
from nebula_mq.models.state import load_state_arrays, state_arrays
from nebula_mq.runtime.checkpoint import Checkpoint
from nebula_mq.runtime.stepped import SteppedWorker
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from workers.base import RoleWorker


def trainable(model: paddle.nn.Layer) -> list[paddle.Tensor]:
    return [p for p in model.parameters() if not p.stop_gradient]


class SplitSide(SteppedWorker, RoleWorker):
    """One side of a split: the activation flow (head -> tail) and the reply flow back."""

    state_prefix: str  # names this side's arrays in the checkpoint
    activation_name = "activation"  # tensor name of the activation in the message
    model: paddle.nn.Layer
    optimizer: paddle.optimizer.Optimizer

    def __init__(self, settings: Settings, cluster: str, worker_id: str, transport: Transport | None, *,
                 flows: tuple[topology.Flow, topology.Flow], in_flight: int, checkpoint_every: int) -> None:
        super().__init__(settings, cluster, worker_id, transport, checkpoint_every=checkpoint_every)
        self.act_flow, self.reply_flow = flows
        self.in_flight = in_flight
        self.total = settings.job.steps

    @abstractmethod
    def compressions(self) -> tuple[FlowCompression, ...]:
        """This side's ends of the flows' compression (checkpointed with the model)."""

    # ------------------------------------------------------------------ optimizer

    def learning_rate(self, step: int) -> float | None:
        """The learning rate of the update that makes ``step + 1`` (None: as the optimizer was built).

        A function of the step alone, so a resumed worker needs no scheduler state."""
        return None

    def step_optimizer(self) -> None:
        lr = self.learning_rate(self.step)
        if lr is not None:
            self.optimizer.set_lr(lr)
        self.optimizer.step()
        self.optimizer.clear_grad()

    # ------------------------------------------------------------------ checkpoint

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = state_arrays(self.state_prefix, self.model, self.optimizer)
        for compression in self.compressions():
            arrays.update(compression.state_arrays(self.state_prefix))
        return arrays, {}

    def load(self, ck: Checkpoint) -> None:
        load_state_arrays(self.state_prefix, self.model, self.optimizer, ck.arrays)
        for compression in self.compressions():
            compression.restore(ck.arrays, self.state_prefix)
