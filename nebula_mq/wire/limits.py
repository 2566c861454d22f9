"""The size check of an outgoing frame, made before it is published.

A frame larger than the job's ``[transport] max_message_bytes`` (never above the brokers'
``max_message_size``, :data:`nebula_mq.settings.BROKER_MAX_MESSAGE_BYTES`) would be refused
by the receiver, or make the broker close the channel. :func:`check_outgoing` refuses it
first with :class:`MessageTooLarge`, one line that names the flow, the micro-batch, both
sizes and the codecs under which the tensors would fit,
e.g. ``flow 'act' micro-batch 12: 140.2 MB encoded (none) > max_message_bytes 96 MiB;
int8 (35.1 MB) or rsvd(0.1) (rank 64, 30.0 MB) would fit``.

What a message would weigh under another codec is known from shapes and dtypes alone: every
codec states the (shape, dtype) of the leaves an input encodes to (``Codec.layout``: exact,
except lz4's, which is data dependent and says the raw size), so the payload of a tensor under
any registered codec is known without encoding it; lz4 ties with ``none`` and is never the one
named. :func:`fitting_codecs` names the least compressing codec without parameters that fits
(one that makes the tensors smaller), and the largest fraction of a low-rank codec that does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nebula_mq.codecs import Codec, Identity, registered
from nebula_mq.errors import OversizedMessage
from nebula_mq.settings import BROKER_MAX_MESSAGE_BYTES
from nebula_mq.wire.envelope import Envelope
from nebula_mq.wire.tree import pad

MIB = 1024 * 1024
#: Header bytes one tensor's codec tree may take beyond another codec's (its parameters and
#: part descriptors): held back from the budget a suggested codec must fit in.
HEADER_SLACK_PER_TENSOR = 128
#: Fractions tried for codecs with a ``fraction`` parameter, largest first: 0.9 ... 0.001.
FRACTIONS: tuple[float, ...] = tuple(round(m * 10.0 ** -e, e) for e in (1, 2, 3) for m in range(9, 0, -1))
#: Among low-rank codecs of equal size, the one named: the sketched SVD is as small as the
#: exact one and much faster on the large matrices an oversized message carries.
PREFERRED_LOW_RANK = ("rsvd", "svd", "powersgd")

TensorShape = tuple[tuple[int, ...], str]  # (shape, numpy dtype name) of one tensor


@dataclass(frozen=True)
class Fit:
    """A codec under which the tensors would fit: its spec, the estimated bytes, and for a
    low-rank codec the rank of the largest matrix."""

    spec: str
    nbytes: int
    rank: int | None = None


def _aligned(n: int) -> int:
    """``n`` bytes as a leaf takes them on the wire (8-byte aligned, ``wire.tree``)."""
    return n + pad(n)


def payload_bytes(codec: Codec, shape: tuple[int, ...], dtype: np.dtype | str) -> int:
    """Wire payload bytes of one tensor under ``codec`` (leaves 8-byte aligned); a dtype the
    codec does not take is counted raw."""
    dt = np.dtype(dtype)
    if not codec.accepts(dt):
        return _aligned(math.prod(shape) * dt.itemsize)
    return sum(_aligned(math.prod(s) * np.dtype(d).itemsize) for s, d in codec.layout(tuple(shape), dt))


def total_bytes(codec: Codec, tensors: Sequence[TensorShape]) -> int:
    return sum(payload_bytes(codec, shape, dtype) for shape, dtype in tensors)


def _required(cls: type[Codec]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def _largest_rank(codec: Codec, tensors: Sequence[TensorShape]) -> int | None:
    matrices = [s for s, _ in tensors if len(s) >= 2 and math.prod(s) > 0]
    if not matrices or not hasattr(codec, "rank"):
        return None
    *_, t, h = max(matrices, key=math.prod)
    return int(codec.rank(t, h))


def fitting_codecs(tensors: Sequence[TensorShape], budget: int) -> list[Fit]:
    """At most two codecs under which ``tensors`` take at most ``budget`` payload bytes: the
    parameterless codec that fits with the least compression (ties: the lower wire id), then
    the low-rank codec (one with a ``rank``) at the largest of :data:`FRACTIONS` that fits."""
    fixed: list[tuple[int, int, Fit]] = []
    low_rank: list[tuple[int, int, Fit]] = []
    raw = total_bytes(Identity(), tensors)
    for wire_id, cls in sorted(registered().items()):
        required = _required(cls)
        if not required:
            codec = cls()
            size = total_bytes(codec, tensors)
            # A codec that only transforms (hadamard: a rotation, padded) is no fix for a size.
            if size <= budget and (size < raw or cls is Identity):
                fixed.append((-size, wire_id, Fit(codec.spec, size)))
        elif required == ["fraction"] and hasattr(cls, "rank"):
            for fraction in FRACTIONS:
                codec = cls.from_params({"fraction": fraction})
                size = total_bytes(codec, tensors)
                if size <= budget:
                    order = PREFERRED_LOW_RANK.index(cls.name) if cls.name in PREFERRED_LOW_RANK else 99
                    low_rank.append((-size, order, Fit(codec.spec, size, _largest_rank(codec, tensors))))
                    break
    return [min(group, key=lambda g: g[:2])[2] for group in (fixed, low_rank) if group]

class MessageTooLarge(OversizedMessage):
    """A message this worker was about to publish is larger than the job's max_message_bytes
    (or the brokers' max_message_size): refused before it was sent, so nothing was published
    or acked for it."""

    reason = "oversized"

    def __init__(self, detail: str, *, frame_bytes: int, limit: int, fits: tuple[Fit, ...]) -> None:
        super().__init__(detail)
        self.frame_bytes = frame_bytes
        self.limit = limit
        self.fits = fits


def send_limit(max_message_bytes: int) -> tuple[int, str]:
    """The largest frame a worker may publish, and the name of the setting that says so."""
    if max_message_bytes <= BROKER_MAX_MESSAGE_BYTES:
        return max_message_bytes, "max_message_bytes"
    return BROKER_MAX_MESSAGE_BYTES, "the brokers' max_message_size"


def megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"


def limit_text(n: int) -> str:
    """A limit as the job file may spell it: whole MiB, else the exact bytes."""
    return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else f"{n} bytes"


def _fit_text(fit: Fit, overhead: int) -> str:
    rank = f"rank {fit.rank}, " if fit.rank is not None else ""
    return f"{fit.spec} ({rank}{megabytes(overhead + fit.nbytes)})"


def check_outgoing(env: Envelope, frame_bytes: int, max_message_bytes: int) -> None:
    """Raise :class:`MessageTooLarge` when a frame of ``frame_bytes`` (sealed, as published)
    of ``env`` exceeds what the job and the brokers take; otherwise do nothing."""
    limit, name = send_limit(max_message_bytes)
    if frame_bytes <= limit:
        return
    payload = sum(_aligned(int(leaf.nbytes)) for t in env.tensors for leaf in t.encoded.leaves())
    overhead = frame_bytes - payload  # prefix, tag, header, padding, the seal: the same under any codec
    budget = limit - overhead - HEADER_SLACK_PER_TENSOR * len(env.tensors)
    fits = tuple(fitting_codecs([(t.shape, t.dtype) for t in env.tensors], budget))
    codecs = ", ".join(sorted({t.codec for t in env.tensors})) or "no tensors"
    head = (f"flow {env.flow!r} micro-batch {env.micro_batch}: {megabytes(frame_bytes)} encoded ({codecs}) "
            f"> {name} {limit_text(limit)}")
    if fits:
        advice = " or ".join(_fit_text(f, overhead) for f in fits) + " would fit"
    else:
        advice = "no codec would fit; send fewer or smaller tensors per micro-batch"
    if frame_bytes <= BROKER_MAX_MESSAGE_BYTES:
        advice += f" (or raise [transport] max_message_bytes, up to {limit_text(BROKER_MAX_MESSAGE_BYTES)})"
    raise MessageTooLarge(f"{head}; {advice}", frame_bytes=frame_bytes, limit=limit, fits=fits)
