"""The size check of an outgoing frame, made before it is published.

A frame larger than the job's ``[transport] max_message_bytes`` (never above the brokers'
``max_message_size``, :data:`nebula_mq.settings.BROKER_MAX_MESSAGE_BYTES`) would be refused
by the receiver, or make the broker close the channel. :func:`check_outgoing` refuses it
first with :class:`MessageTooLarge`, one line that names the flow, the micro-batch, both
sizes and the codecs under which the tensors would fit (``nebula_mq.codecs.sizing``),
e.g. ``flow 'act' micro-batch 12: 140.2 MB encoded (none) > max_message_bytes 96 MiB;
int8 (35.1 MB) or rsvd(0.1) (rank 64, 30.0 MB) would fit``.
"""

from __future__ import annotations

from nebula_mq.codecs.sizing import LEAF_ALIGN, Fit, fitting_codecs
from nebula_mq.errors import OversizedMessage
from nebula_mq.settings import BROKER_MAX_MESSAGE_BYTES
from nebula_mq.wire.envelope import Envelope

MIB = 1024 * 1024
#: Header bytes one tensor's codec tree may take beyond another codec's (its parameters and
#: part descriptors): held back from the budget a suggested codec must fit in.
HEADER_SLACK_PER_TENSOR = 128


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


def _aligned(n: int) -> int:
    return -(-n // LEAF_ALIGN) * LEAF_ALIGN


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
