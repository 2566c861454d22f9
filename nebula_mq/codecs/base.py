"""The codec extension point: one ABC, a tree of encoded parts, a registry by wire id.

A codec turns one numpy array into an :class:`Encoded` node: the codec's wire id,
its parameters, the input's shape and dtype, and a tuple of *parts*. A part is a
plain numpy array (shipped as dtype + shape + raw bytes) or a nested
:class:`Encoded` (composition: in ``fp16(svd(0.6))`` the svd node's two factor
parts are themselves fp16 nodes). Trees are self-describing, so the receiver
decodes with :func:`nebula_mq.codecs.decoding.decode_tree` alone; the chain spec
string on the wire is only informational. The numeric guards the codecs share (byte order,
NaN/Inf, part shapes, saturating casts, scale limits) are here too.

Codecs are stateless frozen dataclasses whose fields are their parameters; the
only per-sender state (the warm-start basis of ``rsvd`` and ``powersgd``) lives in a
:class:`nebula_mq.codecs.lowrank.LowRankState` the caller owns and passes in
:class:`EncodeContext`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Union

import numpy as np

from nebula_mq.errors import CodecError, NonFiniteTensor, ShapeMismatch, UnknownCodec

Scalar = Union[int, float, str, bool]
Part = Union[np.ndarray, "Encoded"]

#: Dtypes that may appear on the wire (inputs and parts). No object/complex/void.
WIRE_DTYPES: frozenset[str] = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"]
)
MAX_NDIM = 8


@dataclass(frozen=True, eq=False)  # eq=False: ndarray parts have no boolean ==
class Encoded:
    codec_id: int  # wire id of the codec that produced this node (registry key)
    params: Mapping[str, Scalar]  # that codec's parameters, enough to rebuild it
    shape: tuple[int, ...]  # shape of the codec's *input*, i.e. of the decoded array
    dtype: str  # numpy dtype name of the codec's input
    parts: tuple[Part, ...]  # arrays (C-contiguous) or nested nodes

    def leaves(self) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for p in self.parts:
            out.extend(p.leaves() if isinstance(p, Encoded) else [p])
        return out

    @property
    def nbytes(self) -> int:
        """Payload bytes of all leaves (what the codec saves is measured on this)."""
        return sum(int(a.nbytes) for a in self.leaves())


@dataclass(frozen=True)
class EncodeContext:
    """What an encode call may know beyond the tensor itself."""

    # NaN/Inf raise NonFiniteTensor unless True (codecs that cannot represent them still raise).
    allow_non_finite: bool = False
    # "activation" | "gradient" | "ids" | None; read by the role-adaptive wrapper.
    role: str | None = None
    # Sender-owned warm-start state for rsvd and powersgd (a LowRankState); None means cold start.
    state: Any = None


_BY_ID: dict[int, type[Codec]] = {}
_BY_NAME: dict[str, type[Codec]] = {}


class Codec(ABC):
    """One compression method. Subclasses are frozen dataclasses of their parameters."""

    #: Wire id; None for structural codecs (chains, adaptive wrappers) that never
    #: appear in a tree themselves.
    wire_id: ClassVar[int | None] = None
    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        wid = cls.__dict__.get("wire_id")
        if wid is None:
            return
        # Checked at import: two codecs sharing an id would decode each other's bytes.
        if wid in _BY_ID:
            raise TypeError(f"codec wire id {wid} of {cls.__name__} already used by {_BY_ID[wid].__name__}")
        if cls.name in _BY_NAME:
            raise TypeError(f"codec name {cls.name!r} of {cls.__name__} already registered")
        if not 0 <= wid < 128:
            raise TypeError(f"codec wire id must be in 0..127, got {wid}")
        _BY_ID[wid] = cls
        _BY_NAME[cls.name] = cls

    # ------------------------------------------------------------------ public API

    def encode(self, x: np.ndarray, *, allow_non_finite: bool = False, role: str | None = None,
               state: Any = None) -> Encoded:
        return self.encode_with(np.asarray(x), EncodeContext(allow_non_finite, role, state))

    def encode_with(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        if x.dtype.name not in WIRE_DTYPES:
            raise CodecError(f"{self.spec}: dtype {x.dtype} cannot travel on the wire")
        if not self.accepts(x.dtype):
            raise CodecError(f"{self.spec}: cannot encode dtype {x.dtype}")
        # Codecs see C-contiguous little-endian data (the wire order); ascontiguousarray
        # would make a 0-d array 1-d.
        x = little_endian(np.asarray(x, order="C"))
        # Numeric trouble the codec did not foresee becomes a refusal instead of a
        # numpy warning and a non-finite payload the receiver would reject.
        try:
            with np.errstate(over="raise", invalid="raise", divide="raise"):
                return self._encode(x, ctx)
        except (FloatingPointError, np.linalg.LinAlgError) as exc:
            raise CodecError(f"{self.spec}: cannot encode {x.dtype}{x.shape}: {exc}") from None

    @property
    def spec(self) -> str:
        """Canonical string form, parseable by :func:`nebula_mq.codecs.parse_codec`."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        args = []
        for i, f in enumerate(fields):
            v = getattr(self, f.name)
            if f.default is dataclasses.MISSING and i == 0:
                args.append(_fmt(v))
            elif f.default is dataclasses.MISSING or v != f.default:
                args.append(f"{f.name}={_fmt(v)}")
        return f"{self.name}({', '.join(args)})" if args else self.name

    def __str__(self) -> str:
        return self.spec

    @property
    def params(self) -> dict[str, Scalar]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Codec:
        """Rebuild from wire/parsed params; any bad key, type or range -> CodecError."""
        names = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = set(params) - set(names)
        if unknown:
            raise CodecError(f"{cls.name}: unknown parameter(s) {sorted(map(str, unknown))}")
        clean: dict[str, Any] = {}
        for key, value in params.items():
            t = names[key].type
            want = t if isinstance(t, str) else t.__name__
            if want == "float" and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            ok = {"float": float, "int": int, "bool": bool, "str": str}.get(want)
            if ok is None or type(value) is not ok:
                raise CodecError(f"{cls.name}: parameter {key} must be {want}, got {value!r}")
            clean[key] = value
        try:
            return cls(**clean)
        except TypeError as exc:
            raise CodecError(f"{cls.name}: {exc}") from None

    def accepts(self, dtype: np.dtype) -> bool:
        """Whether this codec can encode arrays of ``dtype`` (chains skip others)."""
        return dtype.kind == "f"

    def estimated_ratio(self, shape: tuple[int, ...], dtype: np.dtype | str) -> float:
        """Expected payload bytes / raw bytes for an input of this shape and dtype."""
        dtype = np.dtype(dtype)
        raw = math.prod(shape) * dtype.itemsize
        if raw == 0:
            return 1.0
        return sum(math.prod(s) * np.dtype(d).itemsize for s, d in self.layout(tuple(shape), dtype)) / raw

    @abstractmethod
    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        """(shape, dtype) of each leaf an input of this shape/dtype encodes to
        (exact except for data-dependent codecs such as lz4, which give a bound)."""

    # ------------------------------------------------------------------ for subclasses

    @abstractmethod
    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        """``x`` is C-contiguous and of an accepted dtype."""

    @abstractmethod
    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Parts are already decoded to arrays; validate them and rebuild the input."""

    def decode_scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """Bytes ``_decode`` allocates besides its output (temporaries, a library's own buffer).

        Charged to the decode budget while the node decodes, so the cap bounds what
        decoding allocates, not only what it returns."""
        return 0

    def _node(self, x: np.ndarray, *parts: Part) -> Encoded:
        assert self.wire_id is not None
        return Encoded(self.wire_id, self.params, tuple(x.shape), x.dtype.name, tuple(parts))


def _fmt(v: Scalar) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def codec_class(key: int | str) -> type[Codec]:
    table: Mapping[Any, type[Codec]] = _BY_ID if isinstance(key, int) else _BY_NAME
    try:
        return table[key]
    except KeyError:
        raise UnknownCodec(f"unknown codec {key!r}; known: {sorted(_BY_NAME)}") from None


def registered() -> dict[int, type[Codec]]:
    return dict(_BY_ID)


def check_finite(x: np.ndarray, ctx: EncodeContext, who: str, *, representable: bool = True) -> None:
    """Raise NonFiniteTensor for NaN/Inf unless allowed and ``representable`` by ``who``.

    min/max reductions propagate NaN and expose Inf without a boolean temporary.
    """
    if x.size == 0 or x.dtype.kind != "f":
        return
    if math.isfinite(float(x.min())) and math.isfinite(float(x.max())):
        return
    if not ctx.allow_non_finite:
        raise NonFiniteTensor(f"{who}: tensor {x.shape} contains NaN or Inf")
    if not representable:
        raise NonFiniteTensor(f"{who}: cannot represent NaN/Inf even with allow_non_finite")


def expect_parts(who: str, parts: tuple[np.ndarray, ...], *specs: tuple[tuple[int, ...], str | None]) -> None:
    """Check part count, shapes and (optionally) dtype kinds/names; ShapeMismatch otherwise."""
    if len(parts) != len(specs):
        raise ShapeMismatch(f"{who}: expected {len(specs)} parts, got {len(parts)}")
    for i, (part, (shape, dtype)) in enumerate(zip(parts, specs)):
        if tuple(part.shape) != tuple(shape):
            raise ShapeMismatch(f"{who}: part {i} has shape {part.shape}, expected {shape}")
        if dtype is not None and part.dtype.name != dtype and part.dtype.kind != dtype:
            raise ShapeMismatch(f"{who}: part {i} has dtype {part.dtype}, expected {dtype}")


#: Largest finite float32; int8 scales and float32 low-rank factors must stay below it.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def largest_scale(steps: int) -> np.float32:
    """The largest float32 quantisation scale whose ``steps`` steps stay finite (float32 max / steps
    may round up). Encoders clamp their scales to it, so decoders refuse larger ones as forged."""
    scale = np.float32(FLOAT32_MAX) / np.float32(steps)
    with np.errstate(over="ignore"):
        while not np.isfinite(np.float32(steps) * scale):
            scale = np.nextafter(scale, np.float32(0))
    return scale


def is_little_endian(dtype: np.dtype) -> bool:
    order = dtype.byteorder  # "|": single bytes, "=": this machine's order
    return order == "<" or order == "|" or (order == "=" and sys.byteorder == "little")


def little_endian(x: np.ndarray) -> np.ndarray:
    """``x`` itself when its bytes are already little-endian (the wire order), else a converted copy.

    Codecs that work on raw bytes (lz4, the payload writer) would otherwise ship
    big-endian bytes under a dtype name that the receiver reads as little-endian.
    """
    if is_little_endian(x.dtype):
        return x
    return x.astype(x.dtype.newbyteorder("<"))


def work_dtype(dtype: np.dtype) -> np.dtype:
    """The float dtype a codec computes in for ``dtype``: float64 for float64, else float32."""
    return np.dtype(np.float64 if dtype == np.float64 else np.float32)


def narrows(src: np.dtype, dst: np.dtype) -> bool:
    """Whether casting float ``src`` to float ``dst`` can overflow (needs :func:`cast_saturating`'s mask)."""
    return src.kind == "f" and dst.kind == "f" and src.itemsize > dst.itemsize


def cast_saturating(scratch: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``scratch.astype(dtype)``, but finite values beyond ``dtype``'s range become its max, not Inf.

    Rounding can push a reconstruction just past the output range (bf16 rounds
    float16's 65504 up to 65536, a low-rank product of values near the limit
    overshoots it); the input was finite, so the output must be too. NaN and Inf
    already there are kept. ``scratch`` is the caller's temporary and is clipped in
    place; the only extra memory is a boolean mask, and only when narrowing.
    """
    if not narrows(scratch.dtype, dtype):
        return scratch.astype(dtype, copy=False)
    limit = float(np.finfo(dtype).max)
    if scratch.size and not (-limit <= float(scratch.min()) and float(scratch.max()) <= limit):  # true for NaN
        np.clip(scratch, -limit, limit, out=scratch, where=~np.isinf(scratch))  # a real Inf stays Inf
    return scratch.astype(dtype)
