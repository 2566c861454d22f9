"""``nebula-mq bench scenario1``: Scenario I samples/s inside one cluster vs across two.

One run starts a private two-node TLS stack (cluster-a, cluster-b) and, for
each number of discriminator ranks n, trains the same ELECTRA job twice as
real ``nebula-mq worker`` processes:

* **inside**: generator and discriminator ranks all on cluster-b's broker;
* **across**: generator on cluster-a, discriminator ranks on cluster-b; the
  micro-batches cross TLS federation through the emulated WAN, shaped to
  ``--rate-mbit`` (170 Mbit/s by default) with ``--delay-ms`` one-way delay, and the
  sync tokens come back.

Throughput is discriminator samples/s over the steps after a warm-up (from
the root's per-step history timestamps): ``K generators x n shares x batch``
samples per step. The across/inside ratio is the paper's Table 3 (0.85 there;
target >= 0.95). Worker processes import paddle; this module does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nebula_mq.bench.runs import bench_stack, check_repeats, compute_wait, history, rows_dir, run_row, write_json
from nebula_mq.stack.layout import free_group_port

JOB = """
[job]
id = "{job_id}"
scenario = "electra"
seed = 7
steps = {steps}
run_dir = "{run_dir}"

[transport]
prefetch = 8

[electra]
generator_clusters = {gen_clusters}
disc_cluster = "cluster-b"
n_sub = {n}
{lead_line}checkpoint_every = {checkpoint_every}
heldout = 64
gloo_base_port = {port}

[electra.model]
preset = "{preset}"
"""


def electra_job(job_id: str, steps: int, run_dir: str | Path, *, n_sub: int, port: int,
                gen_clusters: Sequence[str] = ("cluster-b",), max_lead: int | None = None,
                checkpoint_every: int = 1000, preset: str = "tiny") -> str:
    """The text of an ELECTRA job file on a stack of cluster-a and cluster-b (and more generator
    clusters): generators on ``gen_clusters``, a gloo group of ``n_sub`` discriminator ranks on
    cluster-b at ``port``; ``max_lead`` None keeps the job's default. The benchmark's job, and
    the tests'."""
    return JOB.format(job_id=job_id, steps=steps, run_dir=run_dir, gen_clusters=json.dumps(list(gen_clusters)),
                      n=n_sub, lead_line="" if max_lead is None else f"max_lead = {max_lead}\n",
                      checkpoint_every=checkpoint_every, port=port, preset=preset)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", default="1,2", help="discriminator ranks to try, comma separated")
    parser.add_argument("--steps", type=int, default=40, help="steps of each run (default 40)")
    parser.add_argument("--warmup", type=int, default=8, help="steps left out of the rate")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="one-way WAN delay of the across run")
    parser.add_argument("--rate-mbit", type=float, default=170.0, help="WAN rate of the across run (default 170)")
    parser.add_argument("--max-lead", type=int, default=None,
                        help="steps the generator may run ahead (default: the job's, [electra] max_lead)")
    parser.add_argument("--preset", default="tiny", help="ELECTRA model preset (default tiny)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="inside/across pairs per n (each pair's ratio; medians reported)")


def run_job(stack_dir: str, root: Path, name: str, *, n: int, steps: int, gen_cluster: str,
            max_lead: int | None, preset: str, init_from: str = "", horizon: int = 0, timeout: float = 900.0) -> Path:
    """Write a job file for these parameters and run it as ``nebula-mq run`` does
    (``bench.runs.run_row``: each worker with its share of the cores); its run directory."""
    config = root / f"{name}.toml"
    text = electra_job(f"s1-{name}-{os.getpid()}", steps, root / name, n_sub=n, port=free_group_port(n),
                       gen_clusters=(gen_cluster,), max_lead=max_lead, preset=preset)
    if init_from:
        text = text.replace("[electra.model]", f'init_from = "{init_from}"\n\n[electra.model]')
    if horizon:
        text += f"total_steps = {horizon}\n"
    config.write_text(text)
    return Path(run_row(str(config), stack_dir, {}, timeout).run_dir)


def plot_losses(curves: list[tuple[str, Path, str]], out: Path, title: str) -> Path:
    """Loss curves from workers' histories: (label, run_dir, "worker:key") per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, run_dir, what in curves:
        worker, key = what.split(":")
        rows = history(run_dir, worker)
        ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def samples_per_s(run_dir: Path, warmup: int) -> tuple[float, dict[str, Any]]:
    """Rate of the root's steps after ``warmup`` (timestamps of its history rows)."""
    rows = history(run_dir, "disc-root")
    from workers.registry import load_job_settings
    from workers.electra.common import model_config
    from workers.electra.job import load_job

    settings = load_job_settings(run_dir.parent / f"{run_dir.name}.toml", environ={})
    job = load_job(settings)
    cfg = model_config(settings, job)
    per_step = len(cfg.generators) * job.n * cfg.batch_size
    t = [r["time"] for r in rows]
    w = min(warmup, len(t) - 2)
    rate = per_step * (len(t) - 1 - w) / (t[-1] - t[w])
    return rate, {"steps": len(t), "samples_per_step": per_step, "final_rtd_loss": rows[-1]["rtd_loss"],
                  "ms_per_step": time_per_step(run_dir, len(t))}


def time_per_step(run_dir: Path, steps: int) -> dict[str, dict[str, float]]:
    """Where each worker's time went, in ms a step over the whole run: ``compute`` (its own
    steps) and ``wait`` (for the other side's messages or sync tokens)."""
    return {worker: {"compute": 1000 * busy / steps, "wait": 1000 * wait / steps}
            for worker, (busy, wait) in compute_wait(run_dir).items()}


# Across, the root's busy share this far below inside's: its waits are the link's round trip.
LEAD_HINT_BELOW = 0.05


def root_busy(detail: dict[str, Any]) -> float:
    """The share of its time the root discriminator (the pipeline's bound) computed rather than
    waited for micro-batches: what the WAN costs it, whatever the shared host's speed at the time."""
    root = detail["ms_per_step"].get("disc-root", {"compute": 0.0, "wait": 0.0})
    busy = root["compute"] + root["wait"]
    return root["compute"] / busy if busy else 0.0


def where_time_goes(row: dict[str, Any]) -> str:
    """One line per pair: each side's compute / wait in ms a step, inside then across, and the
    root's busy share in each."""
    def side(where: str) -> str:
        each = row[f"{where}_detail"]["ms_per_step"]
        return ", ".join(f"{w} {t['compute']:.1f}/{t['wait']:.1f}" for w, t in each.items())
    inside, across = root_busy(row["inside_detail"]), root_busy(row["across_detail"])
    text = (f"  ms a step (compute/wait): inside {side('inside')}; across {side('across')}\n"
            f"  the root busy {100 * inside:.1f}% of its time inside, {100 * across:.1f}% across "
            f"({across / inside if inside else 0.0:.3f}x)")
    if inside and across < inside - LEAD_HINT_BELOW:
        text += ("\n  the root waited longer for micro-batches across: the generator's lead is shorter than "
                 "the sync tokens' round trip in the root's steps; raise [electra] max_lead (it changes no weight)")
    return text


def hot_start(stack: Any, stack_dir: str, root: Path, *, n: int, steps: int, max_lead: int | None, preset: str,
              delay: float, rate_mbit: float) -> dict[str, Any]:
    """Paper §4.3 / Figure 8: train inside one cluster, then resume across two from its checkpoints."""
    stack.shape(None, rate_mbit=0, delay_ms=0)
    inside = run_job(stack_dir, root, f"hot-inside-n{n}", n=n, steps=steps, gen_cluster="cluster-b",
                     max_lead=max_lead, preset=preset, horizon=2 * steps)
    stack.shape(None, rate_mbit=rate_mbit, delay_ms=delay)
    across = run_job(stack_dir, root, f"hot-across-n{n}", n=n, steps=2 * steps, gen_cluster="cluster-a",
                     max_lead=max_lead, preset=preset, init_from=str(inside), horizon=2 * steps)
    plot = plot_losses([("inside one cluster", inside, "disc-root:rtd_loss"),
                        ("resumed across two clusters", across, "disc-root:rtd_loss")],
                       Path("run/bench/scenario1-hotstart.png"), "Scenario I hot start: RTD loss")

    a, b = ([r["rtd_loss"] for r in history(run_dir, "disc-root")] for run_dir in (inside, across))
    return {"before": float(sum(a[-3:]) / 3), "after": float(sum(b[:3]) / 3), "plot": str(plot.resolve()),
            "inside_steps": len(a), "across_steps": len(b)}


def run(args: argparse.Namespace) -> int:
    ns = [int(x) for x in args.n.split(",")]
    steps = 24 if args.quick else args.steps
    warmup = min(args.warmup, steps // 3)
    delay, rate_mbit, lead, preset = args.delay_ms, args.rate_mbit, args.max_lead, args.preset
    repeats = check_repeats(1 if args.quick else args.repeats)
    results: list[dict[str, Any]] = []
    with rows_dir("s1") as root, bench_stack(None) as (stack, _):  # a stack of its own (cluster-a, cluster-b)
        stack_dir = str(stack.layout.run_dir)
        for repeat in range(repeats):
            for n in ns:
                row: dict[str, Any] = {"n": n, "repeat": repeat}
                # Each pair side by side, in turn first: a drift of the shared host favours neither.
                pair = (("inside", "cluster-b"), ("across", "cluster-a"))
                for where, gen_cluster in pair if repeat % 2 == 0 else pair[::-1]:
                    if where == "across":
                        stack.shape(None, rate_mbit=rate_mbit, delay_ms=delay)
                    run_dir = run_job(stack_dir, root, f"{where}-n{n}-r{repeat}", n=n, steps=steps,
                                      gen_cluster=gen_cluster, max_lead=lead, preset=preset)
                    row[where], row[f"{where}_detail"] = samples_per_s(run_dir, warmup)
                row["ratio"] = row["across"] / row["inside"]
                row["busy_ratio"] = root_busy(row["across_detail"]) / max(1e-9, root_busy(row["inside_detail"]))
                results.append(row)
                print(f"n={n}: inside {row['inside']:.1f} samples/s, across {row['across']:.1f} samples/s "
                      f"({rate_mbit:g} Mbit/s, {delay:g} ms), across/inside = {row['ratio']:.3f}", flush=True)
                print(where_time_goes(row), flush=True)
        hot = hot_start(stack, stack_dir, root, n=ns[0], steps=steps, max_lead=lead, preset=preset,
                        delay=delay, rate_mbit=rate_mbit)
    table = by_n(results)
    print(f"\nScenario I throughput vs n ({preset}, {steps} steps, warm-up {warmup}, max_lead {'as the job' if lead is None else lead}"
          + (f", {repeats} pairs each: medians, every pair's ratio after them" if repeats > 1 else "") + "):")
    print(f"{'n':>3} {'inside/s':>10} {'across/s':>10} {'ratio':>7} {'root busy':>10}")
    for r in table:
        each = f"  ({', '.join(f'{x:.2f}' for x in r['ratios'])})" if repeats > 1 else ""
        print(f"{r['n']:>3} {r['inside']:>10.1f} {r['across']:>10.1f} {r['ratio']:>7.3f} {r['busy_ratio']:>9.3f}x{each}")
    print("root busy: the root's share of time computing across over inside (its waits for micro-batches "
          "are the WAN's cost; its compute also swings with the shared host)")
    best = max(table, key=lambda r: r["inside"])
    print(f"across/inside ratio at the fastest n={best['n']}: {best['ratio']:.3f} (target >= 0.95, paper 0.85)")
    print(f"hot start (inside {steps} steps, then across {steps}): RTD loss {hot['before']:.4f} (last 3 inside) "
          f"-> {hot['after']:.4f} (first 3 across); plot {hot['plot']}")
    write_json(args.json, {"delay_ms": delay, "rate_mbit": rate_mbit, "results": results, "by_n": table,
                           "hot_start": hot})
    return 0


def by_n(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per n, in the order tried: the medians over its pairs (rates, ratio, the root's busy ratio)
    and each pair's own ratio."""
    out = []
    for n in dict.fromkeys(r["n"] for r in results):
        pairs = [r for r in results if r["n"] == n]
        out.append({"n": n, "inside": statistics.median(r["inside"] for r in pairs),
                    "across": statistics.median(r["across"] for r in pairs),
                    "ratio": statistics.median(r["ratio"] for r in pairs), "ratios": [r["ratio"] for r in pairs],
                    "busy_ratio": statistics.median(r["busy_ratio"] for r in pairs)})
    return out
