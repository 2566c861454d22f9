"""Low-rank codecs that start from a sketch: randomized SVD and PowerSGD (``lowrank`` has what
all low-rank codecs share, and the exact SVD).

``rsvd`` (Halko et al. 2011) finds the range of each matrix from a Gaussian sketch sharpened by
power iterations, then ships the same ``left = U_k S_k``, ``right = V_k^T`` as ``svd``.

``powersgd`` (PowerSGD, Vogels et al. 2019, as in torch's ``powerSGD_hook``) ships
the other split of the same product: ``left = P`` orthonormal [..., T, k] and
``right = P^T x`` [..., k, H], where ``P = orth(x @ Q)`` and ``Q`` is the previous
message's ``right^T`` (the sender's :class:`~nebula_mq.codecs.lowrank.LowRankState`; a seeded
Gaussian sketch on a cold start). That is one GEMM from the previous basis, one batched
Householder QR and one GEMM back per encode: PowerSGD's warm step, and nothing else. A zero or
rank-deficient ``x @ Q`` still has an orthonormal Householder ``P`` (no NaN); an all-zero
matrix, whose ``right`` is zero, leaves the cold sketch as its next basis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nebula_mq.codecs.base import EncodeContext
from nebula_mq.codecs.lowrank import LowRank, LowRankState
from nebula_mq.errors import CodecError


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
    """PowerSGD's warm step (Vogels et al. 2019; torch's ``powerSGD_hook``), see the module docstring.

    Per encode: ``P = orth(x @ Q)``, ``right = P^T x``; ``Q`` is the previous encode's
    ``right^T`` from the sender's :class:`LowRankState` (per flow, checkpointed by
    ``FlowCompression``), or a seeded Gaussian sketch on a cold start. Without a state
    every encode is a cold start: one pass of a randomized range finder.
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
