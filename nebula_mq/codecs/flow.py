"""All compression state of one flow at one end, in one object (PyTorch's ``PowerSGDState``).

A flow (activations S -> T, or gradients T -> S) is compressed by its sender
and rebuilt by its receiver. Everything that compression remembers between
messages lives in one :class:`FlowCompression` per flow and end, and is saved
in and restored from that end's checkpoint, so a resumed worker encodes and
decodes exactly what an uninterrupted one would:

* the **schedule**: uncompressed before ``compress_from_step``, the chain after
  (paper Figure 10);
* the **tensor roles** the codecs see (``activation``, ``gradient``, ``ids``), so a
  ``role(...)`` chain picks its codec per tensor (hivemind's role-adaptive
  compression);
* the **low-rank warm start** (``rsvd``, ``powersgd``): the last right basis of the main
  tensor (PowerSGD's Q);
* **delta compression** (AQ-SGD) of activations: the sender's per-sample
  reference, and its mirror at the receiver;
* **error feedback** of gradients: the sender's per-sample residual.

A message is **encoded once**: the sender decodes its own encoding to update the
delta reference or the residual, and publishes those very bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from nebula_mq.codecs.base import Codec, Encoded
from nebula_mq.codecs.cast import FP16, LZ4, Identity
from nebula_mq.codecs.decoding import decode_tree
from nebula_mq.codecs.feedback import DeltaCompression, ErrorFeedback, SampleRows
from nebula_mq.codecs.lowrank import LowRankState
from nebula_mq.codecs.parse import parse_codec
from nebula_mq.errors import CodecError

Role = Literal["activation", "gradient"]
# name -> (chain spec, encoded tree): what a message carries per tensor.
EncodedTensors = dict[str, tuple[str, Encoded]]
#: The meta flag of a message whose main tensor is a delta (AQ-SGD).
DELTA_META = "delta"


@dataclass(frozen=True)
class CompressionSchedule:
    """When to compress: identity until ``compress_from_step``, then the chain (paper Figure 10)."""

    compress_from_step: int  # steps before this one are sent uncompressed ("none")
    chain: Codec  # used from compress_from_step on
    warmup: Codec = field(default_factory=Identity)  # used before it

    def __post_init__(self) -> None:
        if self.compress_from_step < 0:
            raise CodecError(f"compress_from_step must be >= 0, got {self.compress_from_step}")

    @classmethod
    def parse(cls, chain: str, compress_from_step: int = 0) -> CompressionSchedule:
        return cls(compress_from_step, parse_codec(chain))

    def codec_for(self, step: int) -> Codec:
        return self.chain if step >= self.compress_from_step else self.warmup


@dataclass(frozen=True)
class Samples:
    """Which samples a [B, T, H] tensor holds, and how many real tokens each has."""

    ids: np.ndarray  # int64 [B]
    lengths: np.ndarray  # int64 [B]


class FlowCompression:
    """One end of one flow: see the module docstring.

    ``main`` names the tensor the flow's chain compresses (the activation, the
    gradient); every other tensor of a message (masks, sample ids) travels
    lossless with role ``ids``.
    """

    def __init__(self, schedule: CompressionSchedule, *, main: str, role: Role, delta: bool = False,
                 feedback: bool = False, allow_non_finite: bool = False, sender: bool = True) -> None:
        """``sender``: this end encodes (its state: delta reference, residual, rsvd basis);
        else it decodes (its state: the delta mirror). Only that end's state is checkpointed."""
        if delta and feedback:
            raise CodecError("a flow uses delta compression (activations) or error feedback (gradients), not both")
        self.schedule = schedule
        self.sender = sender
        self.main = main
        self.role = role
        self.allow_non_finite = allow_non_finite
        self.delta = DeltaCompression() if delta else None  # sender's reference per sample
        self.feedback = ErrorFeedback() if feedback else None  # sender's residual per sample
        self.mirror = DeltaCompression()  # receiver's copy of the sender's reference
        self.lowrank = LowRankState()  # rsvd/powersgd warm start of the main tensor (the others are lossless)

    # ------------------------------------------------------------------ sender

    def takes_fp16(self, step: int) -> bool:
        """Whether step ``step``'s main tensor may come already narrowed to float16 where it was
        made (a GPU): its codec is plain fp16, with no delta or residual to add in float32."""
        return (self.delta is None and self.feedback is None
                and type(self.schedule.codec_for(step)) is FP16)

    def encode(self, step: int, tensors: Mapping[str, np.ndarray], samples: Samples | None = None, *,
               narrowed: bool = False) -> tuple[EncodedTensors, dict[str, object]]:
        """Every tensor of one message, encoded once, and the meta the receiver needs.
        ``narrowed``: the main tensor is a float32 tensor narrowed to float16 already
        (:meth:`takes_fp16` said so); it travels exactly as if this end had cast it."""
        codec = self.schedule.codec_for(step)
        x = np.asarray(tensors[self.main])
        meta: dict[str, object] = {}
        if narrowed:
            if not (self.takes_fp16(step) and isinstance(codec, FP16)):
                raise CodecError(f"{self.main}: a float16-narrowed tensor needs the plain fp16 codec, "
                                 f"step {step} uses {codec.spec}")
            encoded = codec.encode_narrowed(x, allow_non_finite=self.allow_non_finite)
            return {self.main: (codec.spec, encoded), **self._lossless(tensors)}, meta
        if self.delta is not None or self.feedback is not None:
            if samples is None:
                raise CodecError(f"{self.main}: delta compression and error feedback need the samples' ids")
            if self.delta is not None:
                x = self.delta.delta(samples.ids, samples.lengths, x)
                meta[DELTA_META] = True
            else:
                assert self.feedback is not None
                x = self.feedback.with_residual(samples.ids, samples.lengths, x)
        encoded = codec.encode(x, allow_non_finite=self.allow_non_finite, role=self.role,
                               state=self.lowrank)
        if samples is not None and (self.delta is not None or self.feedback is not None):
            sent = decode_tree(encoded)  # what the receiver will decode, bit for bit
            if self.delta is not None:
                self.delta.reconstruct(samples.ids, samples.lengths, sent)
            elif self.feedback is not None:
                self.feedback.keep_residual(samples.ids, samples.lengths, x, sent)
        return {self.main: (codec.spec, encoded), **self._lossless(tensors)}, meta

    def _lossless(self, tensors: Mapping[str, np.ndarray]) -> EncodedTensors:
        """The message's other tensors (ids, masks), lossless."""
        lossless = LZ4()
        return {name: (lossless.spec, lossless.encode(np.asarray(array), role="ids"))
                for name, array in tensors.items() if name != self.main}

    # ------------------------------------------------------------------ receiver

    def decode(self, tensors: Mapping[str, np.ndarray], meta: Mapping[str, object],
               samples: Samples | None = None) -> np.ndarray:
        """The main tensor as the sender meant it (a delta is added to the mirror's reference)."""
        x = tensors[self.main]
        if not meta.get(DELTA_META):
            return x
        if samples is None:
            raise CodecError(f"{self.main}: a delta-compressed message needs the samples' ids")
        return self.mirror.reconstruct(samples.ids, samples.lengths, x)

    # ------------------------------------------------------------------ checkpoint

    def state_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """This end's state, as checkpoint arrays under ``prefix`` (absent parts add nothing,
        so a flow without state leaves the checkpoint as it was)."""
        arrays: dict[str, np.ndarray] = {}
        if not self.sender:
            if len(self.mirror.cache):
                arrays.update(self.mirror.cache.export(f"{prefix}/delta"))
            return arrays
        if self.delta is not None:
            arrays.update(self.delta.cache.export(f"{prefix}/delta"))
        if self.feedback is not None:
            arrays.update(self.feedback.residual.export(f"{prefix}/feedback"))
        if self.lowrank.basis is not None:
            arrays[self._lowrank_key(prefix)] = self.lowrank.basis
        return arrays

    def _lowrank_key(self, prefix: str) -> str:
        return f"{prefix}/lowrank/{self.main}"

    def restore(self, arrays: Mapping[str, np.ndarray], prefix: str) -> None:
        """Inverse of :meth:`state_arrays`."""
        if not self.sender:
            self.mirror = DeltaCompression(SampleRows.restore(arrays, f"{prefix}/delta"))
            return
        if self.delta is not None:
            self.delta = DeltaCompression(SampleRows.restore(arrays, f"{prefix}/delta"))
        if self.feedback is not None:
            self.feedback = ErrorFeedback(SampleRows.restore(arrays, f"{prefix}/feedback"))
        self.lowrank = LowRankState()
        basis = arrays.get(self._lowrank_key(prefix))
        if basis is not None:
            self.lowrank.basis = np.array(basis)
