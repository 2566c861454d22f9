"""Structural codecs: composition (paper eq. 5) and adaptive selection.

None of these has a wire id: they only decide which concrete codecs build the
tree, and the tree alone is what the receiver needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from nebula_mq.codecs.base import Codec, EncodeContext, Encoded
from nebula_mq.errors import CodecError


class Structural(Codec):
    """A codec that only decides which concrete codecs build the tree, which is all that travels."""

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        raise CodecError(f"{self.name} nodes never travel; decode the tree")  # pragma: no cover


@dataclass(frozen=True)
class Chain(Structural):
    """``outer(inner)``: encode with ``inner``, then ``outer`` on every leaf it accepts.

    ``fp16(svd(0.6))`` casts both svd factors to fp16; ``lz4(topk(0.01))``
    compresses both the values and the int32 indices; ``fp16(topk(0.01))`` only
    the values (fp16 does not accept int32).
    """

    outer: Codec
    inner: Codec

    name = "chain"

    @property
    def spec(self) -> str:
        outer = self.outer.spec
        extra = outer[len(self.outer.name) + 1:-1] if "(" in outer else ""
        return f"{self.outer.name}({self.inner.spec}{', ' + extra if extra else ''})"

    def accepts(self, dtype: np.dtype) -> bool:
        return self.inner.accepts(dtype)

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        out: list[tuple[tuple[int, ...], np.dtype]] = []
        for s, d in self.inner.layout(shape, dtype):
            out.extend(self.outer.layout(s, d) if self.outer.accepts(d) else [(s, d)])
        return out

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        # The warm-start state belongs to the inner (low-rank) codec only.
        leaf_ctx = replace(ctx, state=None)
        return self._apply(self.inner.encode_with(x, ctx), leaf_ctx)

    def _apply(self, node: Encoded, ctx: EncodeContext) -> Encoded:
        parts = tuple(
            self._apply(p, ctx) if isinstance(p, Encoded)
            else self.outer.encode_with(p, ctx) if self.outer.accepts(p.dtype)
            else p
            for p in node.parts
        )
        return replace(node, parts=parts)


ROLES = ("activation", "gradient", "ids")


@dataclass(frozen=True)
class ByRole(Structural):
    """Pick a codec by the tensor's role (hivemind RoleAdaptiveCompression)."""

    activation: Codec
    gradient: Codec
    ids: Codec
    default: Codec

    name = "role"

    @property
    def spec(self) -> str:
        return (f"role(activation={self.activation.spec}, gradient={self.gradient.spec}, "
                f"ids={self.ids.spec}, default={self.default.spec})")

    def pick(self, role: str | None) -> Codec:
        return getattr(self, role) if role in ROLES else self.default

    def accepts(self, dtype: np.dtype) -> bool:
        return True

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        return self.default.layout(shape, dtype)

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        return self.pick(ctx.role).encode_with(x, ctx)


@dataclass(frozen=True)
class BySize(Structural):
    """Tensors under ``threshold`` elements (or of a dtype ``large`` refuses) use ``small``.

    Compressing a 1 KiB tensor saves nothing next to per-message overhead and
    a low-rank codec is meaningless on a bias vector (hivemind SizeAdaptiveCompression).
    """

    threshold: int
    small: Codec
    large: Codec

    name = "size"

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise CodecError(f"size: threshold must be >= 0, got {self.threshold}")

    @property
    def spec(self) -> str:
        return f"size({self.threshold}, small={self.small.spec}, large={self.large.spec})"

    def pick(self, shape: tuple[int, ...], dtype: np.dtype) -> Codec:
        big = math.prod(shape) >= self.threshold and self.large.accepts(dtype)
        return self.large if big else self.small

    def accepts(self, dtype: np.dtype) -> bool:
        return self.small.accepts(dtype) or self.large.accepts(dtype)

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        return self.pick(shape, dtype).layout(shape, dtype)

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        return self.pick(x.shape, x.dtype).encode_with(x, ctx)
