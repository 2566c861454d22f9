"""``nebula-mq bench codecs``: ratio, error and single-core speed of every codec.

Inputs are activation-shaped [B, 64, H] tensors: hidden states of the
pretrained e5-small over real sentences (H=384, the ABNet encoder's output),
of a randomly initialised Paddle Transformer (any H), and Gaussian noise for
comparison (the worst case for low-rank codecs: a flat spectrum). Codecs with a
warm start (``rsvd``, ``powersgd``) run cold in the table; ``--peers`` times them
warm on a stream of ``STREAM`` different batches of each input. The models
live in ``nebula_mq.models.activations``; this module never imports paddle. BLAS is pinned to one thread so MB/s are
per core; the process re-executes itself when the pin was not in place before
numpy loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from nebula_mq.bench.runs import cpu_model

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
SHAPES = [(32, 64, 384), (128, 64, 768)]
CHAINS = ["none", "fp16", "bf16", "int8", "int8(block=64)", "int4", "int4(block=64)", "int4(hadamard(32))",
          "int4(hadamard(64), block=64)", "int3", "int3(hadamard)", "int2(hadamard)", "topk(0.1)", "lz4", "svd(0.6)",
          "rsvd(0.6)", "powersgd(0.6)", "fp16(svd(0.6))", "fp16(rsvd(0.6))", "fp16(powersgd(0.6))", "fp16(svd(0.2))",
          "int8(svd(0.6))"]
#: Batches per input for --peers: the low-rank peers run warm over a stream of changing batches
#: (the first is their cold start). The table above uses the first batch only.
STREAM = 8
LOWRANK_FRACTIONS = [0.1, 0.3, 0.6]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers", action="store_true",
                        help="also time torch's casts, quantize_per_channel and PowerSGD's math on the same tensors "
                             "(pip install -e '.[torch]')")


def _median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def _machine() -> dict[str, Any]:
    import numpy as np

    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas_info = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001 - informational only
        blas_info = "unknown"
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "blas": blas_info, "threads": {v: os.environ.get(v) for v in _THREAD_VARS}}


def _inputs(shapes: list[tuple[int, int, int]], batches: int = 1) -> list[tuple[str, list[Any]]]:
    """(label, ``batches`` different [B, T, H] batches) per input; the first batch is the same
    whatever ``batches`` is (the rows of one larger draw, split)."""
    import numpy as np

    def split(x: Any, b: int) -> list[Any]:
        return [np.ascontiguousarray(x[i * b:(i + 1) * b]) for i in range(batches)]

    out = []
    for shape in shapes:
        b, t, h = shape
        try:  # paddle is imported by the model code, never by this module or the codecs
            from nebula_mq.models import activations
        except ImportError:
            print(f"  (paddle not installed: no model activations for {shape})")
        else:
            if h == 384:  # the ABNet encoder's width: real pretrained states on real text
                try:
                    out.append((f"e5-small{shape}", split(activations.pretrained_activations(b * batches, t), b)))
                except Exception as exc:  # noqa: BLE001 - weights or catalogues missing: say so
                    print(f"  (no pretrained activations for {shape}: {exc})")
            out.append((f"random-transformer{shape}",
                        split(activations.random_transformer_activations((b * batches, t, h)), b)))
        gauss = np.random.default_rng(1).standard_normal((b * batches, t, h)).astype(np.float32)
        out.append((f"gaussian{shape}", split(gauss, b)))
    return out


def _bench(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from nebula_mq.codecs import SVD, RandomizedSVD, decode_tree, parse_codec

    repeats = 3 if args.quick else 5
    shapes = SHAPES[:1] if args.quick else SHAPES
    machine = _machine()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()))
    rows, lowrank, peer_rows = [], [], []
    for label, stream in _inputs(shapes, STREAM if args.peers else 1):
        x = stream[0]
        raw_mb = x.nbytes / 1e6
        norm = float(np.linalg.norm(x))
        print(f"\n{label}: {x.nbytes / 2**20:.1f} MiB float32")
        print(f"  {'codec':28s} {'ratio':>7s} {'rel.err':>9s} {'enc MB/s':>9s} {'dec MB/s':>9s}")
        for spec in CHAINS:
            codec = parse_codec(spec)
            t_enc, enc = _median_time(lambda: codec.encode(x), repeats)
            t_dec, y = _median_time(lambda: decode_tree(enc), repeats)
            row = {"input": label, "codec": spec, "ratio": enc.nbytes / x.nbytes,
                   "rel_err": float(np.linalg.norm(y - x)) / norm,
                   "encode_MBps": raw_mb / t_enc, "decode_MBps": raw_mb / t_dec}
            rows.append(row)
            print(f"  {spec:28s} {row['ratio']:7.4f} {row['rel_err']:9.2e} {row['encode_MBps']:9.0f} {row['decode_MBps']:9.0f}")
        if args.peers:
            from nebula_mq.bench.codec_peers import peers

            print(f"  beside the peers, encode, one thread (casts: this batch; low rank: warm, over {STREAM} batches):")
            peer_rows += [{"input": label, **r} for r in peers(stream, _median_time, repeats)]
        for frac in LOWRANK_FRACTIONS:
            t_svd, e_svd = _median_time(lambda: SVD(frac).encode(x), max(1, repeats - 2))
            t_rsvd, e_rsvd = _median_time(lambda: RandomizedSVD(frac).encode(x), repeats)
            err_svd = float(np.linalg.norm(decode_tree(e_svd) - x)) / norm
            err_rsvd = float(np.linalg.norm(decode_tree(e_rsvd) - x)) / norm
            item = {"input": label, "fraction": frac, "rank": SVD(frac).rank(*x.shape[-2:]),
                    "svd_s": t_svd, "rsvd_s": t_rsvd, "speedup": t_svd / t_rsvd,
                    "svd_err": err_svd, "rsvd_err": err_rsvd, "err_ratio": err_rsvd / err_svd}
            lowrank.append(item)
            print(f"  exact vs randomized, r={frac} (k={item['rank']}): svd {t_svd * 1e3:.0f} ms, "
                  f"rsvd {t_rsvd * 1e3:.0f} ms -> {item['speedup']:.1f}x faster; "
                  f"error {err_svd:.4f} vs {err_rsvd:.4f} (ratio {item['err_ratio']:.3f})")
    return {"machine": machine, "codecs": rows, "lowrank": lowrank, "peers": peer_rows}


def _targets(result: dict[str, Any]) -> list[str]:
    from nebula_mq.bench.codec_peers import ERROR_TOLERANCE

    out = []
    for spec in ("fp16", "int8"):
        speeds = [r["encode_MBps"] for r in result["codecs"] if r["codec"] == spec]
        out.append(f"{spec} encode >= 1000 MB/s: {'met' if min(speeds) >= 1000 else 'MISSED'} (min {min(speeds):.0f})")
    for item in result["lowrank"]:
        ok = item["speedup"] >= 8 and item["err_ratio"] <= 1.10
        out.append(f"rsvd >= 8x svd, err within 10% [{item['input']} r={item['fraction']}]: "
                   f"{'met' if ok else 'MISSED'} ({item['speedup']:.1f}x, {item['err_ratio']:.3f})")
    for r in result.get("peers", []):
        if r["target"] is None:
            continue
        ok = r["ratio"] >= r["target"] and r.get("err_ratio", 1.0) <= ERROR_TOLERANCE
        err = f", error {r['err_ratio']:.4f}x" if "err_ratio" in r else ""
        out.append(f"{r['codec']} encode >= {r['target']}x {r['peer']} [{r['input']}]: "
                   f"{'met' if ok else 'MISSED'} ({r['ratio']:.2f}x{err})")
    from nebula_mq.codecs import parse_codec
    ratio = parse_codec("fp16(svd(0.6))").estimated_ratio((1, 64, 768), "float32")
    ratio_384 = parse_codec("fp16(svd(0.6))").estimated_ratio((1, 64, 384), "float32")
    out.append(f"fp16(svd(0.6)) ratio, 64 tokens: H=768 {ratio:.3f}, H=384 {ratio_384:.3f} (paper Table 5: 0.30)")
    return out


def run(args: argparse.Namespace) -> int:
    if any(os.environ.get(v) != "1" for v in _THREAD_VARS):
        # BLAS reads these when it loads; numpy may already be loaded, so start afresh.
        env = {**os.environ, **{v: "1" for v in _THREAD_VARS}}
        argv = [sys.executable, "-m", "nebula_mq", "bench", "codecs"]
        argv += (["--json-out", args.json] if args.json else []) + (["--quick"] if args.quick else [])
        argv += ["--peers"] if args.peers else []
        os.execve(sys.executable, argv, env)
    result = _bench(args)
    result["targets"] = _targets(result)
    print("\ntargets:")
    for line in result["targets"]:
        print("  " + line)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
        print(f"\nwrote {args.json}")
    return 0
