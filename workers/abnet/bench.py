"""The paddle half of ``nebula-mq bench compute``: ABNet's training steps and a plain matmul,
timed side by side in one process (``nebula_mq.bench.compute`` prints them)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import paddle

from nebula_mq.models.abnet import DecoderSide, EncoderSide
from nebula_mq.models.flops import StepShape, decoder_step_flops, encoder_step_flops, matmul_flops
from nebula_mq.settings import Settings
from workers.abnet.job import load_job, load_side, model_config, target_keep_ids

MATMUL_SHAPE = (2048, 384, 1536)  # the FFN product of 2048 tokens of a hidden-384 model


def _median_time(fn: Any, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_compute(settings: Settings, repeats: int) -> tuple[list[dict[str, Any]], int]:
    """Per side: s/step, GFLOP/step, achieved GFLOP/s and the same-run matmul GFLOP/s; and the batch size."""
    job = load_job(settings)
    seed = settings.job.seed
    cfg = model_config(job, seed)
    src = load_side(job, seed, "src", cfg.encoder.vocab)
    tgt = load_side(job, seed, "tgt", cfg.decoder.vocab)
    encoder, decoder = EncoderSide(cfg), DecoderSide(cfg, target_keep_ids(job, tgt))
    enc_opt = paddle.optimizer.AdamW(learning_rate=job.lr, parameters=encoder.trainable_parameters())
    dec_opt = paddle.optimizer.AdamW(learning_rate=job.lr, parameters=decoder.trainable_parameters())
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
    return rows, job.batch_size
