"""The rows of the compression study: paper Table 5, Figure 10, and what goes beyond the paper."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from nebula_mq.codecs import parse_codec
from nebula_mq.errors import CodecError, ConfigError

TABLE5_RATIOS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)


@dataclass(frozen=True)
class StudyRow:
    """One training run of the study: the codec chains and their stateful wrappers."""

    forward: str  # activation chain (S -> T), e.g. "fp16(svd(0.6))"
    backward: str  # gradient chain (T -> S), e.g. "int8"
    compress_from_step: int = 0  # Figure 10: uncompressed before this step
    # "delta": activations as the quantised change since the sample's last epoch (AQ-SGD).
    forward_feedback: str = "none"
    # "residual": per-sample error feedback of the gradient codec.
    backward_feedback: str = "none"
    # How the row was chosen ("table5", "figure10", "delta", "auto"), for the report.
    origin: str = "table5"
    # Micro-batches in flight; 0 = the study's. 1 is the paper's way of running
    # (one micro-batch at a time: compute and transfer take turns).
    in_flight: int = 0

    def __post_init__(self) -> None:
        for chain in (self.forward, self.backward):
            try:
                parse_codec(chain)
            except CodecError as exc:
                raise ConfigError("study", "rows", "codec chains", f"{chain!r}: {exc}") from None
        if self.in_flight < 0:
            raise ConfigError("study", "rows", "in_flight >= 0", self.in_flight)
        if self.forward_feedback not in ("none", "delta") or self.backward_feedback not in ("none", "residual"):
            raise ConfigError("study", "rows", "feedback none|delta and none|residual",
                              (self.forward_feedback, self.backward_feedback))

    @property
    def chain(self) -> str:
        """The paper's notation: ``FP16(SVD(0.6))+INT8``, plus our extensions."""
        if self.forward == "none" and self.backward == "none" and not self.compress_from_step:
            return "baseline" + (f" ({self.in_flight} in flight)" if self.in_flight else "")
        fwd = self.forward.upper() if self.forward != "none" else "NONE"
        bwd = self.backward.upper() if self.backward != "none" else "NONE"
        if self.forward_feedback == "delta":
            fwd = f"DELTA({fwd})"
        if self.backward_feedback == "residual":
            bwd = f"EF({bwd})"
        name = f"{fwd}+{bwd}"
        if self.compress_from_step:
            name += f" from step {self.compress_from_step}"
        if self.in_flight:
            name += f" ({self.in_flight} in flight)"
        return name

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.chain.lower()).strip("-")


# The uncompressed pipeline with the study's micro-batches in flight.
BASELINE = StudyRow("none", "none")
# The paper's baseline: uncompressed, one micro-batch at a time, so every step
# pays compute plus both transfers (Table 5's time tracks the bytes sent).
SEQUENTIAL_BASELINE = StudyRow("none", "none", origin="paper", in_flight=1)


def table5(ratios: Sequence[float] = TABLE5_RATIOS) -> list[StudyRow]:
    """Both baselines, FP16+INT8, FP16(SVD(r))+INT8 for every r (paper Table 5)."""
    return ([SEQUENTIAL_BASELINE, BASELINE, StudyRow("fp16", "int8")]
            + [StudyRow(f"fp16(svd({r}))", "int8") for r in ratios])


def figure10(from_steps: Sequence[int], ratio: float = 0.6) -> list[StudyRow]:
    """FP16(SVD(0.6))+INT8 switched on at each of ``from_steps`` (paper Figure 10)."""
    return [StudyRow(f"fp16(svd({ratio}))", "int8", k, origin="figure10") for k in from_steps if k > 0]


def beyond_paper() -> list[StudyRow]:
    """Delta compression of activations with error feedback of gradients, and EF alone."""
    return [
        StudyRow("int8", "int8", forward_feedback="delta", backward_feedback="residual", origin="delta"),
        StudyRow("fp16(svd(0.5))", "int8", forward_feedback="delta", backward_feedback="residual", origin="delta"),
        StudyRow("fp16(svd(0.5))", "int8", backward_feedback="residual", origin="delta"),
    ]
