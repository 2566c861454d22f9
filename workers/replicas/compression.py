"""The compression of one replica's pseudo-gradients, all its state in one object.

A pseudo-gradient is one array per trainable parameter. Each parameter is a
:class:`~nebula_mq.codecs.flow.FlowCompression` main tensor of its own (role ``gradient``,
the ``[replicas] codec`` chain, error feedback when asked), seen as one sample ``[1, rows,
cols]`` (a 2-D weight's rows, a bias as one row), so per-row codecs such as ``int8`` keep a
scale per row and the residual is kept per parameter.

A round's pseudo-gradient is **encoded once** and those bytes go to every other cluster
(one flow per receiving cluster): every receiver decodes the same numbers, and the sender
averages its own decoded pseudo-gradient, not the exact one, so every cluster sums identical
inputs. The residual of error feedback therefore belongs to the sender's stream of
pseudo-gradients, not to one receiving flow (copies per flow would hold the same numbers, and
any difference between them would make clusters disagree); it is saved with the sender's
checkpoint. Receivers keep no state (no delta compression on this flow).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from nebula_mq.codecs import CompressionSchedule, decode_tree
from nebula_mq.codecs.flow import EncodedTensors, FlowCompression, Samples
from nebula_mq.errors import ShapeMismatch

Arrays = dict[str, np.ndarray]
ONE = np.zeros(1, np.int64)  # the sample id of every parameter's one "sample"


def as_sample(x: np.ndarray) -> np.ndarray:
    """``x`` as one sample ``[1, rows, cols]``: the last axis is a row, a scalar one value."""
    cols = x.shape[-1] if x.ndim else 1
    return np.asarray(x, np.float32).reshape(1, math.prod(x.shape) // max(cols, 1), cols)


class PseudoGradientCompression:
    """Encodes one replica's pseudo-gradients; decodes any replica's (see the module docstring)."""

    def __init__(self, chain: str, feedback: bool, allow_non_finite: bool = False) -> None:
        self.chain, self.feedback, self.allow_non_finite = chain, feedback, allow_non_finite
        self.schedule = CompressionSchedule.parse(chain)
        self.params: dict[str, FlowCompression] = {}

    def _of(self, name: str) -> FlowCompression:
        if name not in self.params:
            self.params[name] = FlowCompression(self.schedule, main=name, role="gradient", feedback=self.feedback,
                                                allow_non_finite=self.allow_non_finite)
        return self.params[name]

    def encode(self, round_: int, delta: Mapping[str, np.ndarray]) -> tuple[EncodedTensors, Arrays]:
        """Round ``round_``'s pseudo-gradient, encoded once, and what every receiver decodes from it."""
        encoded: EncodedTensors = {}
        decoded: Arrays = {}
        for name in sorted(delta):
            x = as_sample(delta[name])
            tensors, _meta = self._of(name).encode(round_, {name: x}, Samples(ONE, np.array([x.shape[1]])))
            encoded[name] = tensors[name]
            decoded[name] = decode_tree(tensors[name][1]).reshape(np.shape(delta[name]))
        return encoded, decoded

    @staticmethod
    def decode(tensors: Mapping[str, np.ndarray], like: Mapping[str, np.ndarray]) -> Arrays:
        """A received pseudo-gradient, shaped as the parameters ``like``; a missing or odd
        tensor is a ``ShapeMismatch``."""
        out: Arrays = {}
        for name, ref in like.items():
            got = tensors.get(name)
            if got is None or got.size != ref.size:
                raise ShapeMismatch(f"pseudo-gradient {name}: expected {ref.shape}, got "
                                    f"{None if got is None else got.shape}")
            out[name] = np.asarray(got, np.float32).reshape(ref.shape)
        return out

    def state_arrays(self, prefix: str) -> Arrays:
        arrays: Arrays = {}
        for name, compression in sorted(self.params.items()):
            arrays.update(compression.state_arrays(f"{prefix}/{name}"))
        return arrays

    def restore(self, arrays: Mapping[str, np.ndarray], names: list[str], prefix: str) -> None:
        """The state of every parameter in ``names`` (absent: a fresh one, as before its first round)."""
        self.params = {}
        for name in names:
            self._of(name).restore(arrays, f"{prefix}/{name}")
