"""When to compress: identity until ``compress_from_step``, then the chain (paper Figure 10)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nebula_mq.codecs.base import Codec
from nebula_mq.codecs.cast import Identity
from nebula_mq.codecs.parse import parse_codec
from nebula_mq.errors import CodecError


@dataclass(frozen=True)
class CompressionSchedule:
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
