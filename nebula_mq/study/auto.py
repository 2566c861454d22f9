"""``auto``: pick the codec chains from the measured link and compute time.

The paper leaves the choice of the ratio open (§5, "trade-off"). The rule here:
in a pipeline with several micro-batches in flight a step costs about
``max(compute + codec, wire)``, where codec is the chains' encode and decode time
measured on this machine, so compression only pays until the wire time hides
behind compute. Among candidates listed from most to least accurate, take the
first whose estimated wire time per step (each direction has its own capacity)
fits within ``headroom`` x (compute + its codec time), unless a more accurate
chain steps no slower (its codec is cheaper by more than the wire time the
fitting chain saves): then that one. If none fits, the one with the smallest
estimated step time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nebula_mq.codecs import decode_tree, parse_codec
from nebula_mq.study.rows import StudyRow

# Most accurate first: lossless, casts, delta int8 with feedback, int4 blocks, then decreasing SVD
# ranks. On real activations block-wise int4 is both more accurate and smaller than fp16(svd(0.6))
# (docs/quality.md, "Compression study on real data"), so it comes before every low-rank row.
DEFAULT_CANDIDATES: tuple[StudyRow, ...] = (
    StudyRow("none", "none", origin="auto"),
    StudyRow("fp16", "fp16", origin="auto"),
    StudyRow("fp16", "int8", origin="auto"),
    StudyRow("int8", "int8", forward_feedback="delta", backward_feedback="residual", origin="auto"),
    StudyRow("int4", "int8", forward_feedback="delta", backward_feedback="residual", origin="auto"),
    StudyRow("int4", "int4", forward_feedback="delta", backward_feedback="residual", origin="auto"),
    *(StudyRow(f"fp16(svd({r}))", "int8", forward_feedback="delta", backward_feedback="residual", origin="auto")
      for r in (0.6, 0.4, 0.3, 0.2)),
)


@dataclass(frozen=True)
class LinkProfile:
    rate_mbit: float  # measured (or shaped) capacity per direction
    compute_s: float  # measured compute per step, both sides, without transfer
    activation_shape: tuple[int, ...]  # a typical [B, S, H] activation (gradients have the same)
    overhead_bytes: int = 2048  # envelope, mask and ids per message


@dataclass(frozen=True)
class Choice:
    row: StudyRow
    wire_s: float  # estimated per step, slower direction
    codec_s: float  # measured encode + decode time of both chains on the typical shape
    step_s: float  # estimate: max(compute + codec, wire)


def activation_shape(forward_bytes: float, batch: int, hidden: int) -> tuple[int, int, int]:
    """The typical [B, S, H] of an uncompressed activation message of ``forward_bytes``: B*S*H
    float32, a B*S int8 mask and B int64 ids (the envelope left out)."""
    seq = max(1, round((forward_bytes - 8 * batch) / (batch * (4 * hidden + 1))))
    return batch, seq, hidden


def _codec_seconds(chain: str, x: np.ndarray, repeats: int = 3) -> float:
    """The best of ``repeats`` encode + decode round trips of ``x`` through ``chain``."""
    codec = parse_codec(chain)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        decode_tree(codec.encode(x), max_decoded_bytes=2 * x.nbytes + (1 << 20))
        best = min(best, time.perf_counter() - t0)
    return best


def estimate(row: StudyRow, link: LinkProfile, x: np.ndarray) -> Choice:
    raw = x.nbytes
    rate = link.rate_mbit * 1e6 / 8 if link.rate_mbit > 0 else float("inf")
    fwd = parse_codec(row.forward).estimated_ratio(x.shape, x.dtype) * raw + link.overhead_bytes
    bwd = parse_codec(row.backward).estimated_ratio(x.shape, x.dtype) * raw + link.overhead_bytes
    wire = max(fwd, bwd) / rate
    codec = _codec_seconds(row.forward, x) + _codec_seconds(row.backward, x)
    return Choice(row, wire, codec, max(link.compute_s + codec, wire))


def pick(link: LinkProfile, candidates: Sequence[StudyRow] = DEFAULT_CANDIDATES,
         headroom: float = 0.9, seed: int = 0) -> Choice:
    """The chain ``auto`` uses on this link (see the module docstring)."""
    if not candidates:
        raise ValueError("no candidate chains")
    x = np.random.default_rng(seed).standard_normal(link.activation_shape).astype(np.float32)
    choices = [estimate(row, link, x) for row in candidates]
    for i, c in enumerate(choices):
        if c.wire_s <= headroom * (link.compute_s + c.codec_s):
            # min() keeps the first of equals: the most accurate chain among the fastest.
            return min(choices[: i + 1], key=lambda d: d.step_s)
    return min(choices, key=lambda c: c.step_s)
