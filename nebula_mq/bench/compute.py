"""``nebula-mq bench compute JOB.toml``: each side's compute per step against the machine's matmul rate.

For an ABNet job on its real batches: seconds per training step of the encoder
(S: forward at send time, recompute and backward at apply time, optimizer step)
and of the decoder (T: loss and gradient, optimizer step), each alone with the
threads a worker of ``nebula-mq run`` gets; the FLOPs of those steps
(``nebula_mq.models.flops``), hence the achieved GFLOP/s; and, measured in the
same run with the same threads, a plain paddle matrix product's GFLOP/s. The
ratio of the two is how close the model's step comes to what the machine's
matrix unit can do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

MATMUL_SHAPE = (2048, 384, 1536)  # the FFN product of 2048 tokens of a hidden-384 model


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", metavar="JOB.toml", help="an ABNet job file (its model and data are measured)")
    p.add_argument("--steps", type=int, default=12, help="timed steps per side (default 12; 3 with --quick)")
    p.add_argument("--threads", type=int, default=0,
                   help="math threads per side (default: what `nebula-mq run` gives each worker)")


def _median_time(fn: Any, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from nebula_mq.errors import ConfigError
    from nebula_mq.models.cpu import configure_cpu
    from nebula_mq.settings import load_settings

    settings = load_settings(args.config)
    if settings.job.scenario != "abnet":
        raise ConfigError(args.config, "job.scenario", "an ABNet job (bench compute measures ABNet)",
                          settings.job.scenario)
    threads = args.threads or max(1, len(os.sched_getaffinity(0)) // 2)
    configure_cpu(threads)
    import paddle

    from nebula_mq.models.abnet import DecoderSide, EncoderSide
    from nebula_mq.models.flops import StepShape, decoder_step_flops, encoder_step_flops, matmul_flops
    from workers.abnet_common import load_job, load_side, model_config, target_keep_ids

    job = load_job(settings)
    seed = settings.job.seed
    cfg = model_config(job, seed)
    src = load_side(job, seed, "src", cfg.encoder.vocab)
    tgt = load_side(job, seed, "tgt", cfg.decoder.vocab)
    encoder, decoder = EncoderSide(cfg), DecoderSide(cfg, target_keep_ids(job, tgt))
    enc_opt = paddle.optimizer.AdamW(learning_rate=job.lr, parameters=encoder.trainable_parameters())
    dec_opt = paddle.optimizer.AdamW(learning_rate=job.lr, parameters=decoder.trainable_parameters())
    repeats = 3 if args.quick else args.steps
    batches = [src.source(mb) for mb in range(repeats + 2)]

    def shape_of(ids: np.ndarray, s: np.ndarray) -> StepShape:
        return StepShape(len(ids), s.shape[1], tgt.targets(ids).shape[1] - 1, len(decoder.head.bias))

    def encoder_step(ids: np.ndarray, s: np.ndarray, m: np.ndarray) -> float:
        with paddle.no_grad():
            encoder(s, m)  # send time
        out = encoder(s, m)  # apply time: recompute, then backward
        encoder.backward(out, np.random.default_rng(0).normal(0, 1e-3, out.shape).astype(np.float32))
        enc_opt.step()
        enc_opt.clear_grad()
        return encoder_step_flops(cfg, shape_of(ids, s))

    def decoder_step(ids: np.ndarray, s: np.ndarray, m: np.ndarray) -> float:
        decoder.loss_and_grad(activations[id(s)], m, tgt.targets(ids))
        dec_opt.step()
        dec_opt.clear_grad()
        return decoder_step_flops(cfg, shape_of(ids, s))

    with paddle.no_grad():  # T's inputs: computed beforehand, they are not T's work
        activations = {id(s): encoder(s, m).numpy() for _, s, m in batches}
    measured = {}
    for side, step in (("encoder (S)", encoder_step), ("decoder (T)", decoder_step)):
        encoder._frozen_cache.clear()  # every micro-batch is new to the encoder
        for batch in batches[:2]:
            step(*batch)  # warm-up
        seconds, flops = [], []
        for batch in batches[2:]:
            t0 = time.perf_counter()
            flops.append(step(*batch))
            seconds.append(time.perf_counter() - t0)
        measured[side] = (seconds, flops)
    m, k, n = MATMUL_SHAPE
    a, b = paddle.randn([m, k]), paddle.randn([k, n])
    mm_s = _median_time(lambda: paddle.matmul(a, b), 10)
    mm_gflops = matmul_flops(m, k, n) / mm_s / 1e9
    rows = []
    for side, (seconds, flops) in measured.items():
        # Batches differ in length: rates are total FLOPs over total time, not a median's.
        achieved = sum(flops) / sum(seconds) / 1e9
        rows.append({"side": side, "s_per_step": statistics.mean(seconds), "gflop_per_step": statistics.mean(flops) / 1e9,
                     "gflops": achieved, "matmul_gflops": mm_gflops, "ratio": achieved / mm_gflops})
    print(f"bench compute: {args.config}, batch {job.batch_size}, {threads} thread(s) per side, "
          f"{repeats} steps of the job's own batches per side (mean); matmul {m}x{k}x{n} (median of 10)")
    print(f"{'side':<12} {'s/step':>8} {'GFLOP/step':>11} {'GFLOP/s':>8} {'matmul GFLOP/s':>15} {'ratio':>6}")
    for r in rows:
        print(f"{r['side']:<12} {r['s_per_step']:>8.3f} {r['gflop_per_step']:>11.2f} {r['gflops']:>8.1f} "
              f"{r['matmul_gflops']:>15.1f} {r['ratio']:>6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": threads, "batch": job.batch_size, "rows": rows}, indent=1))
    return 0
