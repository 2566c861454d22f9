"""``nebula-mq bench codecs --peers``: our codecs beside the best implementations a user could
reach instead, on the same tensors, single-threaded, in the same run.

Peers (``pip install -e '.[torch]'``; each is skipped, saying so, when it is missing):

* torch's casts ``.half()`` and ``.bfloat16()``;
* torch's ``quantize_per_channel`` (int8, one scale per row: what our ``int8`` does);
* PowerSGD (``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``): its warm step
  ``P = M Q; P = orthogonalise(P)`` (the hook's own ``_orthogonalize``: a batched QR)
  ``; Q = M^T P`` per [T, H] matrix, at the rank our ``svd`` codec keeps.

Every line gives both speeds and their ratio; the targets of issue 18 are checked on them. Ours
and the peer run in turn, call by call, and each speed is the median of its calls.

The low-rank rows run on a *stream* of different batches (the first one is the cold start,
the others are timed): our ``powersgd`` with a :class:`LowRankState` and PowerSGD with its
Q, both warm from their own previous step and both starting from the same seeded Gaussian
sketch, step by step in turn, so neither sees a batch twice or runs at a quieter moment.
Speeds are medians over all timed steps of all repeats; errors are the mean relative error
of the timed steps. ``rsvd`` with the same kind of state is shown beside them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

# (our chain, peer name, target ratio of our encode speed to the peer's)
CAST_TARGETS = (("fp16", "torch .half()", 0.9), ("bf16", "torch .bfloat16()", 0.9),
                ("int8", "torch quantize_per_channel", 1.0))
LOWRANK_FRACTION = 0.6
#: Our error may exceed PowerSGD's by this factor and still count as equal: the two run the same
#: math in float32 with different BLAS and LAPACK, so their errors differ in the last digits.
ERROR_TOLERANCE = 1.001


def peers(stream: list[Any], timer: Callable[[Callable[[], Any], int], tuple[float, Any]],
          repeats: int) -> list[dict[str, Any]]:
    """One row per (codec, peer) on the batches ``stream`` [B, T, H] (casts on the first one);
    empty when torch is not installed."""
    import numpy as np

    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("  (peers skipped: torch is not installed; pip install -e '.[torch]')")
        return []
    from nebula_mq.codecs import parse_codec

    torch.set_num_threads(1)
    x = stream[0]
    t = torch.from_numpy(np.ascontiguousarray(x))
    rows2d = t.reshape(-1, t.shape[-1])
    mb = x.nbytes / 1e6

    def int8_per_row() -> Any:
        scales = rows2d.abs().amax(dim=1).clamp_min(1e-12) / 127.0
        return torch.quantize_per_channel(rows2d, scales, torch.zeros_like(scales, dtype=torch.int64), 0, torch.qint8)

    peer_fns = {"torch .half()": lambda: t.half(), "torch .bfloat16()": lambda: t.bfloat16(),
                "torch quantize_per_channel": int8_per_row}
    out = []
    for spec, peer, target in CAST_TARGETS:
        codec = parse_codec(spec)
        mine: list[float] = []
        peer_times: list[float] = []
        codec.encode(x), peer_fns[peer]()  # first calls (lazy initialisation) are not timed
        for _ in range(max(repeats, 9)):  # in turn, so that a busy moment slows both
            mine.append(timer(lambda: codec.encode(x), 1)[0])
            peer_times.append(timer(peer_fns[peer], 1)[0])
        ours, theirs = statistics.median(mine), statistics.median(peer_times)
        out.append({"codec": spec, "peer": peer, "ours_MBps": mb / ours, "peer_MBps": mb / theirs,
                    "ratio": theirs / ours, "target": target})
    if len(stream) > 1:
        out += _lowrank(stream, repeats, torch)
    else:
        print("  (low-rank peers skipped: they need a stream of batches)")
    for r in out:
        err = (f"; error {r['ours_err']:.4f} vs {r['peer_err']:.4f} ({r['err_ratio']:.4f}x, target <= 1.0x"
               f" within {ERROR_TOLERANCE - 1:.1%})" if "ours_err" in r else "")
        if r["target"] is None:
            verdict = "for comparison"
        else:
            ok = r["ratio"] >= r["target"] and r.get("err_ratio", 1.0) <= ERROR_TOLERANCE
            verdict = f"target >= {r['target']}x: {'met' if ok else 'MISSED'}"
        print(f"  {r['codec']:14s} {r['ours_MBps']:8.0f} MB/s vs {r['peer']:34s} {r['peer_MBps']:8.0f} MB/s "
              f"-> {r['ratio']:.2f}x ({verdict}){err}")
    return out


def _lowrank(stream: list[Any], repeats: int, torch: Any) -> list[dict[str, Any]]:
    """Warm encodes of our low-rank codecs and PowerSGD's warm step, on the same stream, in turn."""
    import numpy as np

    from nebula_mq.codecs import SVD, LowRankState, decode_tree, parse_codec

    def qr_in_place(m: Any) -> None:
        m.copy_(torch.linalg.qr(m)[0])

    orthogonalise: Callable[[Any], Any] = qr_in_place
    try:  # the hook's own orthogonalisation (a batched QR in place, at these ranks)
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook  # type: ignore[import-not-found, unused-ignore]

        orthogonalise = powerSGD_hook._orthogonalize
    except (ImportError, AttributeError):  # pragma: no cover - torch builds without distributed
        print("  (PowerSGD's own _orthogonalize is missing: a batched torch.linalg.qr stands in)")

    b, tt, h = stream[0].shape
    k = SVD(LOWRANK_FRACTION).rank(tt, h)
    mats = [torch.from_numpy(np.ascontiguousarray(m)) for m in stream]
    # PowerSGD starts from the Gaussian sketch our cold start uses (same seed, same values).
    sketch = np.random.default_rng(0).standard_normal((h, k), dtype=np.float32)
    q0 = torch.from_numpy(sketch).expand(b, h, k).contiguous()

    def rel(approx: Any, m: Any) -> float:
        return float(np.linalg.norm(approx - m) / np.linalg.norm(m))

    def ours(spec: str) -> tuple[list[float], list[float]]:
        codec, state, times, errs = parse_codec(spec), LowRankState(), [], []
        for i, m in enumerate(stream):
            t0 = time.perf_counter()
            enc = codec.encode(m, state=state)
            if i:
                times.append(time.perf_counter() - t0)
                errs.append(rel(decode_tree(enc), m))
        return times, errs

    def powersgd() -> tuple[list[float], list[float]]:
        q, times, errs = q0.clone(), [], []
        for i, m in enumerate(mats):
            t0 = time.perf_counter()
            p = torch.bmm(m, q)
            orthogonalise(p)
            q = torch.bmm(m.transpose(1, 2), p)
            if i:
                times.append(time.perf_counter() - t0)
                errs.append(rel(torch.bmm(p, q.transpose(1, 2)).numpy(), m.numpy()))
        return times, errs

    specs = [f"powersgd({LOWRANK_FRACTION})", f"rsvd({LOWRANK_FRACTION})"]
    runs: dict[str, tuple[list[float], list[float]]] = {s: ([], []) for s in [*specs, "peer"]}
    for _ in range(repeats):  # in turn, so that both see the same machine
        for name, fn in [*((s, lambda s=s: ours(s)) for s in specs), ("peer", powersgd)]:
            times, errs = fn()
            runs[name][0].extend(times)
            runs[name][1][:] = errs  # deterministic: the same every repeat
    mb = stream[0].nbytes / 1e6
    peer_s, peer_err = statistics.median(runs["peer"][0]), float(np.mean(runs["peer"][1]))
    out = []
    for spec, target in zip(specs, (1.0, None)):
        s, err = statistics.median(runs[spec][0]), float(np.mean(runs[spec][1]))
        out.append({"codec": spec, "peer": f"PowerSGD warm step, rank {k}", "ours_MBps": mb / s,
                    "peer_MBps": mb / peer_s, "ratio": peer_s / s, "target": target,
                    "ours_err": err, "peer_err": peer_err, "err_ratio": err / peer_err,
                    "warm_steps": len(runs[spec][0])})
    return out
