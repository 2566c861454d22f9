"""``nebula-mq bench codecs --peers``: our codecs beside the best implementations a user could
reach instead, on the same tensors, single-threaded, in the same run.

Peers (``pip install -e '.[peers]'``; each is skipped, saying so, when it is missing):

* torch's casts ``.half()`` and ``.bfloat16()``;
* torch's ``quantize_per_channel`` (int8, one scale per row: what our ``int8`` does);
* PowerSGD's math (``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``): one power
  iteration from the previous Q, then orthogonalisation, at the rank our ``svd`` codec keeps.

Every line gives both speeds and their ratio; the targets of issue 18 are checked on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# (our chain, peer name, target ratio of our encode speed to the peer's)
CAST_TARGETS = (("fp16", "torch .half()", 0.9), ("bf16", "torch .bfloat16()", 0.9),
                ("int8", "torch quantize_per_channel", 1.0))


def peers(x: Any, timer: Callable[[Callable[[], Any], int], tuple[float, Any]], repeats: int) -> list[dict[str, Any]]:
    """One row per (codec, peer) on tensor ``x`` [B, T, H]; empty when torch is not installed."""
    import numpy as np

    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("  (peers skipped: torch is not installed; pip install -e '.[peers]')")
        return []
    from nebula_mq.codecs import SVD, decode_tree, parse_codec

    torch.set_num_threads(1)
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
        ours, _ = timer(lambda: codec.encode(x), repeats)
        theirs, _ = timer(peer_fns[peer], repeats)
        out.append({"codec": spec, "peer": peer, "ours_MBps": mb / ours, "peer_MBps": mb / theirs,
                    "ratio": theirs / ours, "target": target})
    # Low rank: PowerSGD's warm iteration at our rank, per [T, H] matrix of the batch.
    frac = 0.6
    k = SVD(frac).rank(*x.shape[-2:])
    mats = t.reshape(-1, *t.shape[-2:])
    q_state = [torch.randn(mats.shape[0], mats.shape[-1], k, generator=torch.Generator().manual_seed(0))]

    def powersgd() -> Any:
        p = torch.bmm(mats, q_state[0])
        p, _ = torch.linalg.qr(p)  # orthogonalisation (PowerSGD's Gram-Schmidt, batched)
        q = torch.bmm(mats.transpose(1, 2), p)
        q_state[0] = q  # warm: the next call starts from this Q (on the same tensor: PowerSGD's best case)
        return p, q

    powersgd()
    theirs, (p, q) = timer(powersgd, repeats)
    approx = torch.bmm(p, q.transpose(1, 2))
    err_theirs = float(torch.linalg.vector_norm(approx - mats) / torch.linalg.vector_norm(mats))
    codec = parse_codec(f"rsvd({frac})")
    ours, enc = timer(lambda: codec.encode(x), repeats)
    err_ours = float(np.linalg.norm(decode_tree(enc) - x) / np.linalg.norm(x))
    out.append({"codec": f"rsvd({frac})", "peer": f"PowerSGD 1 iteration, rank {k}", "ours_MBps": mb / ours,
                "peer_MBps": mb / theirs, "ratio": theirs / ours, "target": 1.0,
                "ours_err": err_ours, "peer_err": err_theirs})
    for r in out:
        err = (f"; error {r['ours_err']:.3f} vs {r['peer_err']:.3f}" if "ours_err" in r else "")
        verdict = "met" if r["ratio"] >= r["target"] else "MISSED"
        print(f"  {r['codec']:10s} {r['ours_MBps']:8.0f} MB/s vs {r['peer']:30s} {r['peer_MBps']:8.0f} MB/s "
              f"-> {r['ratio']:.2f}x (target >= {r['target']}x: {verdict}){err}")
    return out
