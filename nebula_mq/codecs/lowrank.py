"""Low-rank codecs: exact truncated SVD (paper eq. 1-4), randomized SVD and PowerSGD.

All three factor every trailing [T x H] matrix (leading dims are batch: a [B,T,H]
activation is B matrices) and keep ``k = max(1, round(fraction * min(T, H)))``
directions. All ship the same two parts, decoded as one batched GEMM:

* ``left  = U_k * S_k``  [..., T, k]
* ``right = V_k^T``      [..., k, H]

S is folded into U rather than shipped alone (saves the paper's ``+r`` term
and a scaling pass on decode) and into U rather than V because it keeps V
orthonormal: its entries are bounded by 1 and sit around 1/sqrt(H), safely
inside fp16/int8 range, so a following ``fp16`` or ``int8`` only has to cope
with the magnitude of one factor (whose rows are per-token scaled, which also
suits int8's per-row scales). ``powersgd`` ships the other split of the same
product.

``rsvd`` (Halko et al. 2011) finds the range of each matrix from a Gaussian sketch sharpened by
power iterations, then ships the same ``left = U_k S_k``, ``right = V_k^T`` as ``svd``.

``powersgd`` (PowerSGD, Vogels et al. 2019, as in torch's ``powerSGD_hook``) ships
``left = P`` orthonormal [..., T, k] and ``right = P^T x`` [..., k, H], where ``P = orth(x @ Q)``
and ``Q`` is the previous message's ``right^T`` (the sender's :class:`LowRankState`; a seeded
Gaussian sketch on a cold start). That is one GEMM from the previous basis, one batched
Householder QR and one GEMM back per encode: PowerSGD's warm step, and nothing else. A zero or
rank-deficient ``x @ Q`` still has an orthonormal Householder ``P`` (no NaN); an all-zero
matrix, whose ``right`` is zero, leaves the cold sketch as its next basis.

Tensors with fewer than 2 dims (or an empty matrix) are sent raw: the node is
an identity node, which the receiver decodes without knowing why.

Error: ``svd`` leaves exactly the discarded singular energy, ``rsvd`` and ``powersgd``
a projection error <= |x|. Matrices of very large or very small values are factored
after an exact power-of-two rescaling; values so large that a factor row could
overflow the working dtype (max |x| > dtype max / (2 sqrt(H)), for ``powersgd``,
whose ``right`` carries the magnitude along columns, dtype max / (2 sqrt(max(T, H))))
are refused with a CodecError.

A sender that encodes a stream of tensors keeps a :class:`LowRankState` per tensor: the
warm start of ``rsvd`` and ``powersgd``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nebula_mq.codecs.base import (
    Codec, EncodeContext, Encoded, cast_saturating, check_finite, expect_parts, narrows, work_dtype,
)
from nebula_mq.codecs.cast import Identity
from nebula_mq.errors import CodecError


#: Matrices whose max |x| lies in this range are factored as they are (bit-identical
#: to before rescaling existed); outside it, squares in the sketch would overflow
#: or sink into subnormals.
_SAFE_MAGNITUDE = (2.0**-32, 2.0**32)


def _power_of_two_scale(amax: np.ndarray) -> np.ndarray | None:
    """Per-matrix powers of two that bring max |x| into [0.5, 1), or None if none is needed."""
    lo, hi = _SAFE_MAGNITUDE
    if bool(np.all((amax == 0) | ((amax >= lo) & (amax <= hi)))):
        return None
    exponent = np.frexp(amax)[1]
    return np.where(amax > 0, np.ldexp(1.0, exponent), 1.0)


def _finite(a: np.ndarray) -> bool:
    return a.size == 0 or bool(np.isfinite(a.min()) and np.isfinite(a.max()))


_RANGE_CHUNK = 256 * 1024  # elements per reduction call: 1 MiB of float32, so min re-reads max's chunk from L2


def _matrix_amax(a: np.ndarray) -> np.ndarray:
    """max |x| of each matrix of ``a`` [B, T, H] as float64 (NaN where a matrix holds NaN, Inf where Inf):
    one max and one min per chunk of whole matrices, no |x| temporary."""
    nb = a.shape[0]
    flat = a.reshape(nb, -1)
    hi, lo = np.empty(nb, a.dtype), np.empty(nb, a.dtype)
    step = max(1, _RANGE_CHUNK // max(1, flat.shape[1]))
    for i in range(0, nb, step):
        np.max(flat[i:i + step], axis=1, out=hi[i:i + step])
        np.min(flat[i:i + step], axis=1, out=lo[i:i + step])
    with np.errstate(invalid="ignore"):  # -(-Inf), NaN comparisons: the caller checks finiteness
        return np.maximum(hi.astype(np.float64), -lo.astype(np.float64))


class LowRank(Codec):
    """What the low-rank codecs share: the rank, the layout of the factors, the range checks and
    rescaling around ``_factor``, and the decode (see the module docstring)."""

    fraction: float

    def _check_fraction(self) -> None:
        if not (isinstance(self.fraction, float) and 0.0 < self.fraction <= 1.0):
            raise CodecError(f"{self.name}: fraction must be in (0, 1], got {self.fraction!r}")

    def rank(self, t: int, h: int) -> int:
        return max(1, min(min(t, h), round(self.fraction * min(t, h))))

    def layout(self, shape: tuple[int, ...], dtype: np.dtype) -> list[tuple[tuple[int, ...], np.dtype]]:
        if len(shape) < 2 or math.prod(shape) == 0:
            return [(shape, dtype)]  # sent raw, see module docstring
        *lead, t, h = shape
        k = self.rank(t, h)
        return [((*lead, t, k), work_dtype(dtype)), ((*lead, k, h), work_dtype(dtype))]

    def _row_length(self, t: int, h: int) -> int:
        """Length of the longest row or column a factor's magnitude is summed over (see the limit)."""
        return h

    def _encode(self, x: np.ndarray, ctx: EncodeContext) -> Encoded:
        if x.ndim < 2 or x.size == 0:
            check_finite(x, ctx, self.name, representable=False)
            return Identity()._encode(x, ctx)
        t, h = x.shape[-2:]
        work = work_dtype(x.dtype)
        a = x.reshape(-1, t, h).astype(work, copy=False)
        amax = _matrix_amax(a)  # per matrix; also the finiteness check (NaN and Inf reach it)
        if not np.isfinite(amax).all():
            check_finite(x, ctx, self.name, representable=False)  # raises, naming the reason
        # A row of left = U_k S_k has norm <= |row of x| <= sqrt(h) max|x|, and so does
        # every partial sum of the receiver's product: with this limit neither overflows.
        n = self._row_length(t, h)
        limit = float(np.finfo(work).max) / (2.0 * math.sqrt(n))
        if float(amax.max()) > limit:
            raise CodecError(f"{self.name}: |x| up to {float(amax.max()):.3g} is too large for {work} factors of "
                             f"rows of {n} values (limit {limit:.3g}); scale the tensor or use fp16, bf16 or none")
        scale = _power_of_two_scale(amax)
        if scale is not None:  # exact rescaling keeps the sketch products inside the float range
            a = a / scale.astype(work)[:, None, None]
        left, right, keep = self._factor(a, self.rank(t, h), ctx)
        if scale is not None:
            left, right = self._unscale(left, right, scale.astype(work)[:, None, None])
        if not (_finite(left) and _finite(right)):
            raise CodecError(f"{self.name}: factorisation of {x.dtype}{x.shape} produced NaN or Inf")
        if keep is not None and isinstance(ctx.state, LowRankState):  # only a finite basis is remembered
            ctx.state.basis = self._reseed(keep, amax == 0)
        lead = x.shape[:-2]
        return self._node(x, np.ascontiguousarray(left).reshape(*lead, t, -1),
                          np.ascontiguousarray(right).reshape(*lead, -1, h))

    def _unscale(self, left: np.ndarray, right: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Undo the power-of-two rescaling on the factor that carries the magnitude."""
        return left * scale, right

    def _reseed(self, basis: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """The basis to remember, given which matrices were all zero."""
        return basis

    def _factor(self, a: np.ndarray, k: int,
                ctx: EncodeContext) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(left, right, the warm-start basis to remember once both are known finite, or None)."""
        raise NotImplementedError

    def _decode(self, parts: tuple[np.ndarray, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if len(shape) < 2:
            raise CodecError(f"{self.name}: needs a shape with >= 2 dims, got {shape}")
        *lead, t, h = shape
        k = self.rank(t, h)
        expect_parts(self.name, parts, ((*lead, t, k), "f"), ((*lead, k, h), "f"))
        left, right = (p.astype(work_dtype(dtype), copy=False) for p in parts)
        if not (_finite(left) and _finite(right)):  # the encoder refuses NaN/Inf, so such factors are corrupt
            raise CodecError(f"{self.name}: non-finite factor")
        # float16 outputs saturate: the product of factors of values near 65504 may overshoot it.
        return cast_saturating(np.matmul(left, right), dtype)

    def decode_scratch(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        work, n = work_dtype(dtype), math.prod(shape)  # the product is the output when dtypes agree
        return 0 if dtype == work else n * work.itemsize + (n if narrows(work, dtype) else 0)


@dataclass(frozen=True)
class SVD(LowRank):
    """Exact truncated SVD via LAPACK (numpy's batched gesdd)."""

    wire_id = 4
    name = "svd"
    fraction: float

    def __post_init__(self) -> None:
        self._check_fraction()

    def _factor(self, a: np.ndarray, k: int,
                ctx: EncodeContext) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        try:
            u, s, vt = np.linalg.svd(a, full_matrices=False)
        except np.linalg.LinAlgError as exc:
            raise CodecError(f"svd: LAPACK failed: {exc}") from None
        return u[..., :k] * s[..., None, :k], vt[..., :k, :], None


class LowRankState:
    """Warm-start memory of one sender for one tensor stream (PowerSGD style).

    Holds the last right basis (rows span the dominant row space, [B, l, H]).
    The codec stays stateless: the *sender* keeps one of these per tensor name
    and passes it as ``state=``; a mismatched shape simply means a cold start.
    """

    def __init__(self) -> None:
        self.basis: np.ndarray | None = None
        self.warm_starts = 0  # how many encodes could reuse the previous basis

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        b = self.basis
        if b is not None and b.shape == shape and b.dtype == dtype:
            self.warm_starts += 1
            return b
        return None


@dataclass(frozen=True)
class RandomizedSVD(LowRank):
    """Randomized range finder with power iterations (Halko et al. 2011).

    Cost is a handful of [T,H]x[H,l] GEMMs plus l x l eigen-problems instead of
    a full SVD. ``oversample`` extra directions are sketched and then dropped,
    ``iters`` power iterations sharpen a flat spectrum; with a warm ``state``
    the previous basis replaces the random sketch.
    """

    wire_id = 5
    name = "rsvd"
    fraction: float
    iters: int = 1  # power iterations (0 is a single pass)
    oversample: int = 8  # extra sketch columns, truncated away afterwards
    seed: int = 0  # of the Gaussian sketch: encodes are deterministic

    def __post_init__(self) -> None:
        self._check_fraction()
        if not 0 <= self.iters <= 16:
            raise CodecError(f"rsvd: iters must be in 0..16, got {self.iters}")
        if not 0 <= self.oversample <= 1024:
            raise CodecError(f"rsvd: oversample must be in 0..1024, got {self.oversample}")
        if self.seed < 0:
            raise CodecError(f"rsvd: seed must be >= 0, got {self.seed}")

    def _factor(self, a: np.ndarray, k: int,
                ctx: EncodeContext) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        nb, t, h = a.shape
        width = min(k + self.oversample, t, h)
        at = a.transpose(0, 2, 1)
        state = ctx.state if isinstance(ctx.state, LowRankState) else None
        basis = state.take((nb, width, h), a.dtype) if state is not None else None
        if basis is not None:
            y = a @ basis.transpose(0, 2, 1)
        else:  # one sketch shared by the batch: a single large GEMM
            sketch = np.random.default_rng(self.seed).standard_normal((h, width), dtype=a.dtype)
            y = (a.reshape(-1, h) @ sketch).reshape(nb, t, width)
        for _ in range(self.iters):
            y = a @ (at @ np.linalg.qr(y)[0])
        p = np.linalg.qr(y)[0]  # [B,T,l] orthonormal basis of the column space
        m = p.transpose(0, 2, 1) @ a  # [B,l,H]: a ~= p @ m
        w, vecs = np.linalg.eigh(m @ m.transpose(0, 2, 1))  # ascending eigenvalues
        vecs = vecs[..., ::-1]
        s = np.sqrt(np.maximum(w[..., ::-1], 0.0))
        # left @ right == p @ vecs_k @ vecs_k^T @ m whatever s is, so tiny s only
        # needs guarding against division by zero, not against inaccuracy.
        inv = np.where(s > s[..., :1] * 1e-6, 1.0 / np.maximum(s, 1e-30), 0.0).astype(a.dtype)
        right_all = (vecs.transpose(0, 2, 1) @ m) * inv[..., None]  # [B,l,H], ~orthonormal rows
        left = p @ (vecs[..., :k] * s[..., None, :k])
        return left, right_all[:, :k], right_all


@dataclass(frozen=True)
class PowerSGD(LowRank):
    """PowerSGD's warm step, see the module docstring; the sender's :class:`LowRankState` is per
    flow, checkpointed by ``FlowCompression``. Without a state every encode is a cold start: one
    pass of a randomized range finder.
    """

    wire_id = 9
    name = "powersgd"
    fraction: float
    seed: int = 0  # of the cold-start Gaussian sketch: encodes are deterministic

    def __post_init__(self) -> None:
        self._check_fraction()
        if self.seed < 0:
            raise CodecError(f"powersgd: seed must be >= 0, got {self.seed}")

    def _row_length(self, t: int, h: int) -> int:
        # right = P^T x: a column of it has norm <= |column of x| <= sqrt(t) max|x|, and so
        # does a partial sum of the receiver's product; SVD-style rows give the sqrt(h).
        return max(t, h)

    def _unscale(self, left: np.ndarray, right: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return left, right * scale  # left is orthonormal; the magnitude is in right

    def _sketch(self, h: int, k: int, dtype: np.dtype) -> np.ndarray:
        return np.random.default_rng(self.seed).standard_normal((h, k), dtype=dtype)

    def _reseed(self, basis: np.ndarray, zero: np.ndarray) -> np.ndarray:
        # An all-zero matrix leaves right = 0, and x @ 0 would tell the next message nothing:
        # its matrices start from the cold sketch instead (a copy: right itself is shipped).
        if not zero.any():
            return basis
        basis = basis.copy()
        basis[zero] = self._sketch(basis.shape[-1], basis.shape[-2], basis.dtype).T
        return basis

    def _factor(self, a: np.ndarray, k: int,
                ctx: EncodeContext) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        nb, t, h = a.shape
        state = ctx.state if isinstance(ctx.state, LowRankState) else None
        basis = state.take((nb, k, h), a.dtype) if state is not None else None
        if basis is not None:  # warm: one GEMM from the previous right factor
            y = a @ basis.transpose(0, 2, 1)
        else:  # cold: one sketch shared by the batch, a single large GEMM
            y = (a.reshape(-1, h) @ self._sketch(h, k, a.dtype)).reshape(nb, t, k)
        # Householder QR (LAPACK geqrf + orgqr per matrix), as PowerSGD's own QR: orthonormal
        # even for a rank-deficient or zero y. A Cholesky QR with numpy's tools measured slower
        # here (its triangular inverse, np.linalg.inv, costs more than the whole QR).
        p = np.linalg.qr(y)[0]
        right = p.transpose(0, 2, 1) @ a  # [B,k,H]: the least-squares right factor for p
        # right is remembered as it is shipped (in rescaled units, so that the next sketch
        # product stays in range); nothing writes to either.
        return p, right, right
