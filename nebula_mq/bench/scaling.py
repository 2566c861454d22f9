"""``nebula-mq bench scaling JOB.toml``: a split or ABNet job at 1x1, 2x1, 1x2 and 2x2 ranks.

Each row trains the job's model with ``head_ranks x tail_ranks`` data-parallel ranks
(``workers.split.shards``) on the local stack, as real worker processes, with the
job's global batch; every row is printed beside the 1x1 row of the same run:

* **samples/s**: the global batch times the steps after a warm-up, over their time
  (head rank 0's history timestamps);
* **wire bytes per sample**: every byte the workers published (activations and
  gradients, compressed, with envelopes), over the samples trained.

On a 2-core machine the ranks share the cores, so compute cannot scale: the rows
show what the ranks cost (rendezvous, all-reduce, more messages) and that the
bytes per sample do not grow. On a machine with a core or a GPU per rank the
same command shows the speed-up. Worker processes import paddle; this module
does not.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from nebula_mq.bench.runs import add_stack_arguments, measure, row_overrides, rows_dir, run_row, split_job, write_json
from nebula_mq.stack.layout import free_group_port

DEFAULT_RANKS = "1x1,2x1,1x2,2x2"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="job TOML file of a split or abnet job (its model, batch and codecs)")
    parser.add_argument("--ranks", default=DEFAULT_RANKS, help="HEADSxTAILS rows, comma separated")
    parser.add_argument("--steps", type=int, default=60, help="steps per row")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the rate")
    add_stack_arguments(parser, "local stack directory, started if needed (default $NEBULA_RUN_DIR or run/stack)")


def parse_ranks(text: str) -> list[tuple[int, int]]:
    from nebula_mq.errors import ConfigError

    rows = []
    for item in text.split(","):
        heads, sep, tails = item.strip().partition("x")
        if not (sep and heads.isdigit() and tails.isdigit() and int(heads) > 0 and int(tails) > 0):
            raise ConfigError("<command line>", "--ranks", "rows like 1x1,2x1,1x2,2x2", text)
        rows.append((int(heads), int(tails)))
    return rows


def row_env(settings: Any, heads: int, tails: int, steps: int, root: Path) -> dict[str, str]:
    """``NEBULA__`` overrides that make the job file one row of the table."""
    section = settings.job.scenario
    given = settings.scenario_section()
    head_key = "encoder_ranks" if "encoder_ranks" in given else "head_ranks"
    tail_key = "decoder_ranks" if "decoder_ranks" in given else "tail_ranks"
    port = free_group_port(heads + tails + 2)
    name = f"{heads}x{tails}"
    return {
        **row_overrides(f"{settings.job.id}-scale-{name}", root / name, steps),
        f"NEBULA__{section.upper()}__{head_key.upper()}": str(heads),
        f"NEBULA__{section.upper()}__{tail_key.upper()}": str(tails),
        f"NEBULA__{section.upper()}__HEAD_GLOO_PORT": str(port),
        f"NEBULA__{section.upper()}__TAIL_GLOO_PORT": str(port + heads + 1),
    }


def run(args: argparse.Namespace) -> int:
    settings = split_job(args.config)
    rows = parse_ranks(args.ranks)
    steps = 24 if args.quick else args.steps
    warmup = min(args.warmup, steps // 3)
    results: list[dict[str, Any]] = []
    with rows_dir("scaling") as root:
        for heads, tails in rows:
            job = run_row(args.config, args.stack, row_env(settings, heads, tails, steps, root), args.timeout)
            head = job.plan.processes[len(job.plan.processes) - heads].worker_id  # head rank 0
            results.append({"heads": heads, "tails": tails, **measure(job.run_dir, head, warmup)})
            r = results[-1]
            print(f"{heads}x{tails}: {r['samples_per_s']:.1f} samples/s, {r['bytes_per_sample']:.0f} wire bytes/sample",
                  flush=True)
    base = results[0]
    print(f"\n{settings.job.id}: {steps} steps per row, warm-up {warmup}, global batch {base['samples'] / steps:.0f}")
    print(f"{'ranks':>6} {'samples/s':>10} {'vs ' + str(rows[0][0]) + 'x' + str(rows[0][1]):>8} "
          f"{'step s (median)':>16} {'B/sample':>10} {'vs first':>9} {'final loss':>11}")
    for r in results:
        print(f"{r['heads']}x{r['tails']:<4} {r['samples_per_s']:>10.1f} {r['samples_per_s'] / base['samples_per_s']:>7.2f}x "
              f"{r['step_s_median']:>16.3f} {r['bytes_per_sample']:>10.0f} "
              f"{r['bytes_per_sample'] / base['bytes_per_sample']:>8.3f}x {r['final_loss']:>11.4f}")
    print(f"({os.cpu_count()} CPU cores here: ranks share them, so compute does not scale on this machine)")
    write_json(args.json, {"steps": steps, "warmup": warmup, "rows": results})
    return 0
