"""``nebula-mq bench replicas JOB.toml``: DiLoCo against Streaming DiLoCo across the shaped WAN.

One run trains the replicas job once per row, as real worker processes on the local stack
(one replica per cluster, federation over mutual TLS), the same rounds, inner steps and
shards in every row, for each WAN shape (``--rates`` x ``--delay-ms``):

* **diloco**: one fragment, no overlap: at every outer step each cluster waits for the
  others' pseudo-gradients before it trains on;
* **streaming**: the job's ``fragments`` and ``overlap_steps`` (or ``--fragments`` and
  ``--overlap``): a fragment at a time, its outer step landing ``overlap`` inner steps late;
* **sync**: the baseline, synchronous data parallelism (``exchange = "gradients"``): every
  inner step's gradient in float32 to every cluster, the inner optimizer on their mean.

Each row prints every cluster's compute utilisation (its seconds computing over the wall time
of its events after the first round; the rest is waiting for the wire), seconds per outer round, the bytes each cluster sends per inner step, and the final loss. The links'
shape is put back as it was when the run ends. Worker processes import the frameworks; this
module does not.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

from nebula_mq.bench.runs import (add_stack_arguments, history, job_settings, link_shapes, numbers, put_back,
                                  row_overrides, rows_dir, run_row, write_json)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="job TOML file of a replicas job (its model, codec, inner_steps)")
    parser.add_argument("--rounds", type=int, default=0, help="outer rounds per row, at least 2 (default: the job's)")
    parser.add_argument("--rates", default="60", help="WAN rates in Mbit/s each way, comma separated")
    parser.add_argument("--delay-ms", default="20", help="one-way WAN delays in ms, comma separated")
    parser.add_argument("--fragments", type=int, default=0,
                        help="the streaming row's fragments (default: the job's, or 2 when it has 1)")
    parser.add_argument("--overlap", type=int, default=-1,
                        help="the streaming row's overlap_steps (default: the job's, or inner_steps / fragments)")
    parser.add_argument("--modes", default="sync,diloco,streaming",
                        help="rows per WAN shape, comma separated: sync, diloco, streaming")
    add_stack_arguments(parser, "local stack holding the job's clusters (default $NEBULA_RUN_DIR or run/stack)")


def replicas_job(config: str) -> tuple[Any, Any]:
    """The settings and ``[replicas]`` section of a replicas job file; another scenario is a
    one-line ConfigError."""
    from workers.replicas.job import load_job

    settings = job_settings(config, ("replicas",), "replicas")
    return settings, load_job(settings)


def streaming_shape(job: Any, fragments: int, overlap: int) -> tuple[int, int]:
    """The streaming row's (fragments, overlap_steps): the flags', else the job's, else two
    fragments (the smallest divisor of inner_steps above 1) overlapping all of their stride;
    one the job would refuse is a ConfigError."""
    from nebula_mq.errors import ConfigError

    smallest = next(d for d in range(2, job.inner_steps + 1) if job.inner_steps % d == 0) if job.inner_steps > 1 else 1
    p = fragments or (job.fragments if job.fragments > 1 or job.overlap_steps else smallest)
    if p < 1 or job.inner_steps % p:
        raise ConfigError("<command line>", "--fragments", f"a divisor of inner_steps ({job.inner_steps})", p)
    tau = overlap if overlap >= 0 else (job.overlap_steps if p == job.fragments and job.overlap_steps
                                        else job.inner_steps // p)
    if tau > job.inner_steps // p:
        raise ConfigError("<command line>", "--overlap", f"at most inner_steps / fragments ({job.inner_steps // p})",
                          tau)
    return p, tau


def modes(settings: Any, job: Any, names: str, p: int, tau: int, rounds: int) -> list[tuple[str, dict[str, str]]]:
    """Each row's mode and its ``[replicas]`` and ``[job] steps`` overrides: the same inner steps
    on the same shards in every mode; an unknown mode is a one-line ConfigError."""
    from nebula_mq.errors import ConfigError

    section = "NEBULA__REPLICAS__"
    # Every row checkpoints as often per round as the job does, whatever its events per round.
    every = max(1, job.checkpoint_every // job.fragments)

    def row(events_per_round: int, **keys: str) -> dict[str, str]:
        return {**{section + k.upper(): v for k, v in keys.items()}, "NEBULA__JOB__STEPS": str(rounds * events_per_round),
                section + "CHECKPOINT_EVERY": str(every * events_per_round)}

    table = {
        "sync": row(job.inner_steps, exchange="gradients", inner_steps="1", fragments="1", overlap_steps="0",
                    codec="none", error_feedback="false"),
        "diloco": row(1, fragments="1", overlap_steps="0"),
        "streaming": row(p, fragments=str(p), overlap_steps=str(tau)),
    }
    chosen = [m.strip() for m in names.split(",") if m.strip()]
    if not chosen or any(m not in table for m in chosen):
        raise ConfigError("<command line>", "--modes", f"some of {', '.join(table)}, comma separated", names)
    return [(m, table[m]) for m in chosen]


def per_round(env: dict[str, str], job: Any) -> tuple[int, int]:
    """(sync events per outer round, inner steps per event) of a row."""
    if env.get("NEBULA__REPLICAS__EXCHANGE") == "gradients":
        return job.inner_steps, 1
    fragments = int(env["NEBULA__REPLICAS__FRAGMENTS"])
    return fragments, job.inner_steps // fragments


def measure(run_dir: Path, n: int, events_per_round: int, inner_per_event: int) -> dict[str, Any]:
    """A row's figures from its replicas' histories. Utilisation is each replica's seconds
    computing (``compute_s``) over the wall time of its events after the first round (which
    includes waiting for every replica to start); the final loss is the mean inner loss of the
    last round, over every replica."""
    workers = [f"replica-{c}" for c in range(n)]
    rows = {w: history(run_dir, w) for w in workers}
    events = len(rows[workers[0]])
    warm = min(events_per_round - 1, events - 2)  # the event that ends the first round

    def utilisation(h: list[dict[str, Any]]) -> float:
        wall = h[-1]["time"] - h[warm]["time"]
        return sum(r["compute_s"] for r in h[warm + 1:]) / wall if wall > 0 else 0.0

    times = [r["time"] for r in rows[workers[0]]]
    per_event = statistics.median(b - a for a, b in zip(times[warm:], times[warm + 1:]))
    last = [r["loss"] for w in workers for r in rows[w][-events_per_round:]]
    return {"events": events, "round_s": per_event * events_per_round,
            "utilisation": {w: utilisation(h) for w, h in rows.items()},
            "sent_per_inner_step": statistics.mean(sum(r.get("sent_bytes", 0.0) for r in rows[w])
                                                   / (events * inner_per_event) for w in workers),
            "final_loss": statistics.mean(last),
            "final_loss_se": statistics.stdev(last) / len(last) ** 0.5 if len(last) > 1 else 0.0}


def run(args: argparse.Namespace) -> int:
    from nebula_mq.errors import ConfigError
    from nebula_mq.stack import DEFAULT_CLUSTERS, Stack

    settings, job = replicas_job(args.config)
    rates = numbers("60" if args.quick else args.rates, "--rates")
    delays = numbers("20" if args.quick else args.delay_ms, "--delay-ms", allow_zero=True)
    rounds = 4 if args.quick else (args.rounds or max(2, settings.job.steps // job.fragments))
    if rounds < 2:
        raise ConfigError("<command line>", "--rounds", "at least 2 (the first round is left out as warm-up)", rounds)
    p, tau = streaming_shape(job, args.fragments, args.overlap)
    rows_of = modes(settings, job, args.modes, p, tau, rounds)
    stack = Stack(args.stack, tuple(dict.fromkeys([*DEFAULT_CLUSTERS, *job.clusters])))
    stack.up()  # before its links are shaped; a running stack keeps its layout
    before = link_shapes(stack)
    rows: list[dict[str, Any]] = []
    try:
        with rows_dir("replicas") as root:
            for rate in rates:
                for delay in delays:
                    stack.link_up(None, rate_mbit=rate, delay_ms=delay)
                    for mode, overrides in rows_of:
                        name = f"{mode}-{rate:g}mbit-{delay:g}ms"
                        env = row_overrides(f"{settings.job.id}-bench-{name}", root / name) | overrides
                        out = run_row(args.config, args.stack, env, args.timeout)
                        row = {"row": name, "mode": mode, "rate_mbit": rate, "delay_ms": delay,
                               "fragments": int(env.get("NEBULA__REPLICAS__FRAGMENTS", 1)),
                               "overlap_steps": int(env.get("NEBULA__REPLICAS__OVERLAP_STEPS", 0)),
                               **measure(out.run_dir, job.n, *per_round(env, job))}
                        rows.append(row)
                        print(f"{name}: utilisation {min(row['utilisation'].values(), default=0):.0%} (lowest)",
                              flush=True)
    finally:
        put_back(stack, before)
    print(report(settings, job, rows, rounds))
    write_json(args.json, {"rounds": rounds, "inner_steps": job.inner_steps, "rows": rows})
    return 0


def report(settings: Any, job: Any, rows: list[dict[str, Any]], rounds: int) -> str:
    lines = [f"\n{settings.job.id}: {job.n} replicas, {rounds} rounds of {job.inner_steps} inner steps, "
             f"codec {job.codec}{' + error feedback' if job.error_feedback else ''}",
             f"{'row':<26} {'fragments':>9} {'overlap':>7} {'utilisation by cluster':<34} {'s/round':>8} "
             f"{'bytes/inner step':>16} {'final loss (s.e.)':>18}"]
    for r in rows:
        util = ", ".join(f"{w.removeprefix('replica-')}: {s:.0%}" for w, s in sorted(r["utilisation"].items()))
        lines.append(f"{r['row']:<26} {r['fragments']:>9} {r['overlap_steps']:>7} {util:<34} {r['round_s']:>8.2f} "
                     f"{r['sent_per_inner_step']:>16.0f} {r['final_loss']:>10.4f} ({r['final_loss_se']:.4f})")
    lines.append(f"({os.cpu_count()} CPU cores shared by every replica and broker; utilisation = seconds computing / "
                 "wall seconds, after the first round)")
    return "\n".join(lines)
