"""``nebula-mq bench replicas JOB.toml``: DiLoCo against Streaming DiLoCo across the shaped WAN.

One run trains the replicas job once per row, as real worker processes on the local stack
(one replica per cluster, federation over mutual TLS), the same rounds, inner steps and
shards in every row, for each WAN shape (``--rates`` x ``--delay-ms``):

* **diloco**: one fragment, no overlap: at every outer step each cluster waits for the
  others' pseudo-gradients before it trains on;
* **streaming**: the job's ``fragments`` and ``overlap_steps`` (or ``--fragments`` and
  ``--overlap``): a fragment at a time, its outer step landing ``overlap`` inner steps late.

Each row prints every cluster's compute utilisation (its seconds computing over the wall time
of its events after the first round; the rest is waiting for the wire), seconds per outer round, the bytes each cluster sends per inner step, and the final loss. The links'
shape is put back as it was when the run ends. Worker processes import the frameworks; this
module does not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from nebula_mq.bench.scaling import run_row
from nebula_mq.bench.wan_ratio import link_shapes, numbers, put_back


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="job TOML file of a replicas job (its model, codec, inner_steps)")
    parser.add_argument("--rounds", type=int, default=0, help="outer rounds per row (default: the job's steps)")
    parser.add_argument("--rates", default="60", help="WAN rates in Mbit/s each way, comma separated")
    parser.add_argument("--delay-ms", default="20", help="one-way WAN delays in ms, comma separated")
    parser.add_argument("--fragments", type=int, default=0,
                        help="the streaming row's fragments (default: the job's, or 2 when it has 1)")
    parser.add_argument("--overlap", type=int, default=-1,
                        help="the streaming row's overlap_steps (default: the job's, or inner_steps / fragments)")
    parser.add_argument("--stack", "--run-dir", dest="stack", metavar="DIR",
                        default=os.environ.get("NEBULA_RUN_DIR", "run/stack"),
                        help="local stack holding the job's clusters (default $NEBULA_RUN_DIR or run/stack)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per row")


def replicas_job(config: str) -> tuple[Any, Any]:
    """The settings and ``[replicas]`` section of a replicas job file; another scenario is a
    one-line ConfigError."""
    from nebula_mq.errors import ConfigError
    from workers.registry import load_job_settings
    from workers.replicas.job import load_job

    settings = load_job_settings(config)
    if settings.job.scenario != "replicas":
        raise ConfigError(config, "job.scenario", "replicas", settings.job.scenario)
    return settings, load_job(settings)


def streaming_shape(job: Any, fragments: int, overlap: int) -> tuple[int, int]:
    """The streaming row's (fragments, overlap_steps): the flags', else the job's, else two
    fragments overlapping all of their stride; one the job would refuse is a ConfigError."""
    from nebula_mq.errors import ConfigError

    p = fragments or (job.fragments if job.fragments > 1 or job.overlap_steps else 2)
    if p < 1 or job.inner_steps % p:
        raise ConfigError("<command line>", "--fragments", f"a divisor of inner_steps ({job.inner_steps})", p)
    tau = overlap if overlap >= 0 else (job.overlap_steps if p == job.fragments and job.overlap_steps
                                        else job.inner_steps // p)
    if tau > job.inner_steps // p:
        raise ConfigError("<command line>", "--overlap", f"at most inner_steps / fragments ({job.inner_steps // p})",
                          tau)
    return p, tau


def row_env(settings: Any, name: str, rounds: int, root: Path, fragments: int, overlap: int) -> dict[str, str]:
    return {"NEBULA__JOB__ID": f"{settings.job.id}-bench-{name}", "NEBULA__JOB__RUN_DIR": str(root / name),
            "NEBULA__JOB__STEPS": str(rounds), "NEBULA__REPLICAS__FRAGMENTS": str(fragments),
            "NEBULA__REPLICAS__OVERLAP_STEPS": str(overlap)}


def history(run_dir: Path, worker: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "history" / f"{worker}.jsonl").read_text().splitlines()]


def measure(run_dir: Path, n: int, fragments: int, inner_steps: int) -> dict[str, Any]:
    """A row's figures from its replicas' histories: utilisation is each replica's seconds
    computing (``compute_s``) over the wall time of its events after the first round (which
    includes waiting for every replica to start)."""
    workers = [f"replica-{c}" for c in range(n)]
    rows = {w: history(run_dir, w) for w in workers}
    events = len(rows[workers[0]])
    inner = events // fragments * inner_steps
    warm = min(fragments, events - 2)

    def utilisation(h: list[dict[str, Any]]) -> float:
        wall = h[-1]["time"] - h[warm]["time"]
        return sum(r["compute_s"] for r in h[warm + 1:]) / wall if wall > 0 else 0.0

    times = [r["time"] for r in rows[workers[0]]]
    per_event = statistics.median(b - a for a, b in zip(times[warm:], times[warm + 1:]))
    return {"events": events, "round_s": per_event * fragments,
            "utilisation": {w: utilisation(h) for w, h in rows.items()},
            "sent_per_inner_step": statistics.mean(sum(r.get("sent_bytes", 0.0) for r in rows[w]) / inner
                                                   for w in workers),
            "final_loss": statistics.mean(rows[w][-1]["loss"] for w in workers)}


def run(args: argparse.Namespace) -> int:
    from nebula_mq.stack import DEFAULT_CLUSTERS, Stack

    settings, job = replicas_job(args.config)
    rates = numbers("60" if args.quick else args.rates, "--rates")
    delays = numbers("20" if args.quick else args.delay_ms, "--delay-ms", allow_zero=True)
    rounds = 4 if args.quick else (args.rounds or settings.job.steps)
    p, tau = streaming_shape(job, args.fragments, args.overlap)
    root = Path(tempfile.mkdtemp(prefix="nebula-bench-replicas-", dir="/tmp"))
    stack = Stack(args.stack, tuple(dict.fromkeys([*DEFAULT_CLUSTERS, *job.clusters])))
    stack.up()  # before its links are shaped; a running stack keeps its layout
    before = link_shapes(stack)
    rows: list[dict[str, Any]] = []
    try:
        for rate in rates:
            for delay in delays:
                stack.link_up(None, rate_mbit=rate, delay_ms=delay)
                for mode, fragments, overlap in (("diloco", 1, 0), ("streaming", p, tau)):
                    name = f"{mode}-{rate:g}mbit-{delay:g}ms"
                    out = run_row(args.config, args.stack, row_env(settings, name, rounds, root, fragments, overlap),
                                  args.timeout)
                    row = {"row": name, "mode": mode, "rate_mbit": rate, "delay_ms": delay, "fragments": fragments,
                           "overlap_steps": overlap, **measure(out.run_dir, job.n, fragments, job.inner_steps)}
                    rows.append(row)
                    print(f"{name}: utilisation {min(row['utilisation'].values(), default=0):.0%} (lowest)",
                          flush=True)
    finally:
        put_back(stack, before)
        if not os.environ.get("NEBULA_KEEP_BENCH"):
            shutil.rmtree(root, ignore_errors=True)
    print(report(settings, job, rows, rounds))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "inner_steps": job.inner_steps, "rows": rows},
                                              indent=2))
    return 0


def report(settings: Any, job: Any, rows: list[dict[str, Any]], rounds: int) -> str:
    lines = [f"\n{settings.job.id}: {job.n} replicas, {rounds} rounds of {job.inner_steps} inner steps, "
             f"codec {job.codec}{' + error feedback' if job.error_feedback else ''}",
             f"{'row':<26} {'fragments':>9} {'overlap':>7} {'utilisation by cluster':<34} {'s/round':>8} "
             f"{'bytes/inner step':>16} {'final loss':>10}"]
    for r in rows:
        util = ", ".join(f"{w.removeprefix('replica-')}: {s:.0%}" for w, s in sorted(r["utilisation"].items()))
        lines.append(f"{r['row']:<26} {r['fragments']:>9} {r['overlap_steps']:>7} {util:<34} {r['round_s']:>8.2f} "
                     f"{r['sent_per_inner_step']:>16.0f} {r['final_loss']:>10.4f}")
    lines.append(f"({os.cpu_count()} CPU cores shared by every replica and broker; utilisation = seconds computing / "
                 "wall seconds, after the first round)")
    return "\n".join(lines)
