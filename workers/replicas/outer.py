"""DiLoCo's outer step on named numpy arrays: the same float32 operations on every cluster.

Round ``r`` starts from weights ``θ`` that every replica holds bit for bit. Replica ``c``
trains ``H`` inner steps to ``θ_c`` and its pseudo-gradient is ``Δ_c = θ − θ_c``. Every
replica then computes, from the *decoded* pseudo-gradients ``Δ̂_0 .. Δ̂_{N-1}``:

* the average, summed in cluster order: ``Δ̄ = (((Δ̂_0 + Δ̂_1) + Δ̂_2) + ...) / N``;
* the momentum: ``v ← μ v + Δ̄`` (``v`` starts at zero, so the first round's ``v`` is ``Δ̄``);
* the step: ``θ ← θ − lr (Δ̄ + μ v)`` with Nesterov momentum, ``θ ← θ − lr v`` without.

That is ``torch.optim.SGD(params, lr, momentum=μ, nesterov=True)`` (dampening 0, no weight
decay) stepped with ``grad = Δ̄``, as DiLoCo (Douillard et al. 2023, Algorithm 1) and
OpenDiLoCo use it, with ``lr = 0.7`` and ``μ = 0.9`` there. Everything is float32 in a fixed
order, so replicas that start equal and average equal inputs end equal, bit for bit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np

from nebula_mq.errors import ShapeMismatch

Arrays = dict[str, np.ndarray]


def digest(weights: Mapping[str, np.ndarray]) -> str:
    """A short digest of named weights: equal for bit-identical weights."""
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode() + b"\0" + np.ascontiguousarray(weights[name], np.float32).tobytes())
    return h.hexdigest()[:32]


def average(deltas: Sequence[Mapping[str, np.ndarray]]) -> Arrays:
    """The mean of ``deltas`` (one per cluster, in cluster order), summed in that order."""
    if not deltas:
        raise ValueError("no pseudo-gradients to average")
    names = list(deltas[0])
    out: Arrays = {}
    for name in names:
        total = np.array(deltas[0][name], np.float32)
        for other in deltas[1:]:
            part = np.asarray(other[name], np.float32)
            if part.shape != total.shape:
                raise ShapeMismatch(f"pseudo-gradient {name}: {part.shape} != {total.shape}")
            total += part
        out[name] = total / np.float32(len(deltas))
    return out


def mixed(model: Mapping[str, np.ndarray], outer: Mapping[str, np.ndarray], alpha: float) -> Arrays:
    """The model's weights once a fragment's outer weights ``outer`` land: each of its
    parameters ``alpha·model + (1 − alpha)·outer`` (Streaming DiLoCo's mixing; 0: the outer
    weights), the others as they are."""
    out = dict(model)
    a = np.float32(alpha)
    out.update({k: v if alpha == 0 else a * out[k] + (np.float32(1) - a) * v for k, v in outer.items()})
    return out


class OuterNesterov:
    """The outer optimizer: its momentum per parameter, and the step (see the module docstring)."""

    def __init__(self, lr: float, momentum: float, nesterov: bool = True) -> None:
        self.lr, self.momentum, self.nesterov = np.float32(lr), np.float32(momentum), nesterov
        self.velocity: Arrays = {}

    def step(self, start: Mapping[str, np.ndarray], mean_delta: Mapping[str, np.ndarray]) -> Arrays:
        """The weights after the outer step from ``start`` with the averaged pseudo-gradient."""
        out: Arrays = {}
        for name, theta in start.items():
            g = np.asarray(mean_delta[name], np.float32)
            v = self.velocity.get(name)
            v = g.copy() if v is None else self.momentum * v + g
            self.velocity[name] = v
            update = g + self.momentum * v if self.nesterov else v
            out[name] = np.asarray(theta, np.float32) - self.lr * update
        return out

    def state_arrays(self, prefix: str) -> Arrays:
        return {f"{prefix}/{name}": v for name, v in sorted(self.velocity.items())}

    def restore(self, arrays: Mapping[str, np.ndarray], prefix: str) -> None:
        head = f"{prefix}/"
        self.velocity = {k[len(head):]: np.array(v, np.float32) for k, v in arrays.items() if k.startswith(head)}
