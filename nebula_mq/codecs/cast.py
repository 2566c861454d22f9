"""Codecs that keep every value or cast it: identity, lz4 (block compression: lossless, bit-exact,
for any dtype: token ids, masks, indices), fp16 and bf16 (paper's C_FP16)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import lz4.block
import ml_dtypes
import numpy as np

from nebula_mq.codecs.base import Codec, EncodeContext, Encoded, cast_saturating, check_finite, expect_parts, narrows
from nebula_mq.errors import CodecError, NonFiniteTensor, ShapeMismatch

FP16_MAX = float(np.finfo(np.float16).max)  # 65504
_CHUNK = 64 * 1024  # elements per pass: 256 KiB of float32 stays in L2
# Largest float32 that rounds (to nearest even) to a finite bf16: 0x7F7F7FFF.
BF16_SAFE_MAX = float(np.array([0x7F7F7FFF], dtype=np.uint32).view(np.float32)[0])


@dataclass(frozen=True)
class Identity(Codec):
    """Raw bytes; any wire dtype, NaN/Inf pass only with allow_non_finite."""

    wire_id = 0
    name = "none"

    def accepts(self, dtype: np.dtype) -> bool:
        return True

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        return [(shape, dtype)]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        check_finite(x, ctx, self.spec)
        return self._node(x, x)

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        expect_parts(self.spec, parts, (shape, dtype.name))
        return parts[0]


@dataclass(frozen=True)
class LZ4(Codec):
    wire_id = 7
    name = "lz4"

    def accepts(self, dtype: np.dtype) -> bool:
        return True

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        # Data dependent; the raw size is the honest bound (lz4 expands by < 0.4 % + 16 B).
        return [((math.prod(shape) * dtype.itemsize,), np.dtype(np.uint8))]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        check_finite(x, ctx, "lz4")
        packed = lz4.block.compress(x.reshape(-1).view(np.uint8), store_size=False)
        return self._node(x, np.frombuffer(packed, np.uint8))

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if len(parts) != 1 or parts[0].ndim != 1 or parts[0].dtype != np.uint8:
            raise ShapeMismatch("lz4: expected one 1-D uint8 part")
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if n == 0:
            return np.zeros(shape, dtype)
        try:
            raw = lz4.block.decompress(parts[0], uncompressed_size=n)
        except lz4.block.LZ4BlockError as exc:
            raise CodecError(f"lz4: corrupt block: {exc}") from None
        if len(raw) != n:
            raise CodecError(f"lz4: decompressed {len(raw)} bytes, expected {n}")
        return np.frombuffer(raw, dtype).reshape(shape)

    def decode_scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        # python-lz4 decompresses into a buffer of its own, then copies it into the bytes object.
        return math.prod(shape) * dtype.itemsize


_FP16_EXPONENT = 0x7C00  # float16 bits with an all-ones exponent: Inf or NaN
# Every float16 bit pattern's float32, made by numpy's own cast (256 KiB): decoding looks it up.
_FP16_TO_FLOAT32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
_BF16_EXPONENT = 0x7F80  # the same for bfloat16


def _all_ones_exponent(bits: np.ndarray, exponent: int) -> bool:
    """Whether any 16-bit float in ``bits`` (viewed as int16) is Inf or NaN: as int16 the positive
    ones are >= ``exponent``, as uint16 the negative ones are >= 0x8000 | ``exponent``."""
    return bits.size > 0 and (int(bits.max()) >= exponent or int(bits.view(np.uint16).max()) >= 0x8000 | exponent)


def _range(x: np.ndarray) -> tuple[float, float]:
    return (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)


@dataclass(frozen=True)
class FP16(Codec):
    """IEEE half precision; finite values beyond +-65504 are clamped, not turned into Inf."""

    wire_id = 1
    name = "fp16"

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        return [(shape, np.dtype(np.float16))]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        # Cast first, chunk by chunk, and check the float16 *output* while it is in L2: a
        # finite input below 65520 rounds (to nearest even) to at most 65504, exactly what
        # clamping first gives, and anything else (NaN, Inf, |x| >= 65520) shows up as an
        # all-ones exponent. Two integer max passes over half the bytes replace the min and
        # max passes over the input; only a chunk that fails redoes the clamping below.
        out = np.empty(x.shape, np.float16)
        src, dst = x.reshape(-1), out.reshape(-1)
        for i in range(0, src.size, _CHUNK):
            chunk, half = src[i:i + _CHUNK], dst[i:i + _CHUNK]
            with np.errstate(over="ignore"):  # overflow to Inf is what the check below looks for
                np.copyto(half, chunk, casting="unsafe")
            if not _all_ones_exponent(half.view(np.int16), _FP16_EXPONENT):
                continue
            lo, hi = float(chunk.min()), float(chunk.max())
            if not (math.isfinite(lo) and math.isfinite(hi)) and not ctx.allow_non_finite:
                raise NonFiniteTensor(f"fp16: tensor {x.shape} contains NaN or Inf")
            clipped = np.clip(chunk, -FP16_MAX, FP16_MAX)
            np.copyto(clipped, chunk, where=~np.isfinite(chunk))  # clip would turn Inf into 65504
            np.copyto(half, clipped, casting="unsafe")
        return self._node(x, out)

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        expect_parts(self.spec, parts, (shape, "float16"))
        if dtype == np.float32:  # a table lookup: bit for bit numpy's cast, two to four times faster
            return np.take(_FP16_TO_FLOAT32, parts[0].view(np.uint16).reshape(-1)).reshape(shape)
        return parts[0].astype(dtype)

    def encode_narrowed(self, half: np.ndarray, *, allow_non_finite: bool = False) -> Encoded:
        """The node :meth:`encode` makes of a float32 tensor, from that tensor already narrowed
        where it lives (a GPU): finite values clamped to +-65504, then rounded to nearest even
        (``models.frameworks`` ``narrow_fp16``). The bytes and the decoded float32 are the
        same as :meth:`encode`'s; NaN or Inf is refused the same way."""
        half = np.ascontiguousarray(half, dtype=np.float16)
        if not allow_non_finite and _all_ones_exponent(half.view(np.int16), _FP16_EXPONENT):
            raise NonFiniteTensor(f"fp16: tensor {half.shape} contains NaN or Inf")
        assert self.wire_id is not None
        return Encoded(self.wire_id, self.params, tuple(half.shape), "float32", (half,))


@dataclass(frozen=True)
class BF16(Codec):
    """bfloat16 (upper 16 bits of float32, round-to-nearest-even), shipped as uint16."""

    wire_id = 2
    name = "bf16"

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        return [(shape, np.dtype(np.uint16))]

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        if x.dtype == np.float32 and x.dtype.isnative:
            out = self._encode_float32(x.reshape(-1))
            if out is not None:
                return self._node(x, out.reshape(x.shape))
        check_finite(x, ctx, self.spec)
        # 1-D throughout: ufuncs on a 0-d array return scalars, which cannot be assigned into.
        flat = x.reshape(-1)
        lo, hi = _range(flat)
        # Clamp in the input's own dtype: float64 beyond float32's range would turn
        # into Inf on the cast below. False for NaN too, which then takes this path
        # so that huge finite values beside a NaN are clamped as well.
        if x.dtype.itemsize >= 4 and not (-BF16_SAFE_MAX <= lo and hi <= BF16_SAFE_MAX):
            clamped = np.clip(flat, -BF16_SAFE_MAX, BF16_SAFE_MAX)
            np.copyto(clamped, flat, where=np.isinf(flat))  # Inf stays Inf (allow_non_finite)
            flat = clamped
        f = flat.astype(np.float32, copy=True)
        u = f.view(np.uint32)
        nan = np.isnan(f) if ctx.allow_non_finite else None
        # Round to nearest even on the discarded 16 bits, in place.
        u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
        out = (u >> np.uint32(16)).astype(np.uint16)
        if nan is not None and nan.any():
            out[nan] = 0x7FC0  # rounding may have carried a NaN into Inf
        return self._node(x, out.reshape(x.shape))

    @staticmethod
    def _encode_float32(flat: np.ndarray) -> np.ndarray | None:
        """The common case in one read of the input: chunk by chunk, ml_dtypes' float32 ->
        bfloat16 cast (round to nearest even, about 4x the bit arithmetic below), then a check
        of the output in L2: NaN, Inf and values beyond BF16_SAFE_MAX (which round to Inf) all
        have an all-ones exponent. None when a chunk has one: the general path below handles
        those."""
        out = np.empty(flat.size, ml_dtypes.bfloat16)
        bits = out.view(np.int16)
        for i in range(0, flat.size, _CHUNK):
            np.copyto(out[i:i + _CHUNK], flat[i:i + _CHUNK], casting="unsafe")
            if _all_ones_exponent(bits[i:i + _CHUNK], _BF16_EXPONENT):
                return None
        return out.view(np.uint16)

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        expect_parts(self.spec, parts, (shape, "uint16"))
        wide = parts[0].reshape(-1).astype(np.uint32)  # 1-D: see _encode
        wide <<= np.uint32(16)
        # float16 outputs saturate: bf16 rounds float16's 65504 up to 65536.
        return cast_saturating(wide.view(np.float32), dtype).reshape(shape)

    def decode_scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        n = math.prod(shape)  # the float32 buffer is the output itself for float32
        return 0 if dtype == np.float32 else 4 * n + (n if narrows(np.dtype(np.float32), dtype) else 0)
