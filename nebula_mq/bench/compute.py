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
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", metavar="JOB.toml", help="an ABNet job file (its model and data are measured)")
    p.add_argument("--steps", type=int, default=12, help="timed steps per side (default 12; 3 with --quick)")
    p.add_argument("--threads", type=int, default=0,
                   help="math threads per side (default: what `nebula-mq run` gives each worker)")


def run(args: argparse.Namespace) -> int:
    from nebula_mq.bench.runs import job_settings
    from nebula_mq.models.cpu import configure_cpu

    settings = job_settings(args.config, ("abnet",), "an ABNet job (bench compute measures ABNet)")
    threads = args.threads or max(1, len(os.sched_getaffinity(0)) // 2)
    configure_cpu(threads)
    from workers.abnet.bench import MATMUL_SHAPE, measure_compute

    repeats = 3 if args.quick else args.steps
    rows, batch = measure_compute(settings, repeats)
    m, k, n = MATMUL_SHAPE
    print(f"bench compute: {args.config}, batch {batch}, {threads} thread(s) per side, "
          f"{repeats} steps of the job's own batches per side (mean); matmul {m}x{k}x{n} (median of 10)")
    print(f"{'side':<12} {'s/step':>8} {'GFLOP/step':>11} {'GFLOP/s':>8} {'matmul GFLOP/s':>15} {'ratio':>6}")
    for r in rows:
        print(f"{r['side']:<12} {r['s_per_step']:>8.3f} {r['gflop_per_step']:>11.2f} {r['gflops']:>8.1f} "
              f"{r['matmul_gflops']:>15.1f} {r['ratio']:>6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": threads, "batch": batch, "rows": rows}, indent=1))
    return 0
