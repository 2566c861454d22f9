"""``nebula-mq bench wan JOB.toml``: the same split or ABNet job inside one cluster and across the WAN.

The number a user cares about: how much of the in-cluster speed a job keeps when its
two halves sit in two data centres. One run trains the job's model (its codecs,
``in_flight``, batch and data) for ``--steps`` steps once per row, on the local stack,
as real worker processes:

* **in-cluster**: both sides on the head's cluster (``tail_cluster = head_cluster``):
  every flow is local to one broker, no federation, no WAN;
* **WAN rate/delay**: the job's own two clusters, the stack's WAN links shaped to that
  rate and one-way delay, federation over mutual TLS. A rate is in Mbit/s each way, or a wire
  factor: ``4x`` is the rate at which one step's uncompressed wire, in the slower direction,
  takes 4 times the compute of the busier side in one cluster (the paper's regime is about 4).
  A factor follows the host: where a step computes longer, the same regime is a slower link,
  so a claim made in the regime can be checked on any machine.

With ``--codecs auto`` each WAN row trains with the chains the study's rule
(``nebula_mq.study.auto``) picks for its link; ABNet jobs choose among all of its candidates,
a split job among those without feedback (delta activations and gradient error feedback are
ABNet's: they keep state per sample). A wire factor and ``auto`` need the same figures
(:class:`Profile`), from an uncompressed in-cluster row: the slower side's compute seconds per
step in the steady state (the step the row's rate implies after its warm-up, times that side's
compute share: the totals would count the first steps' imports, and a median step would leave
out the batches of long sentences, which take up to ten times the typical step on real data),
and each side's published bytes per step (the head's give the typical [B, S, H] activation).
They are taken once, from the first repeat's in-cluster row, so every repeat runs one link and
trains the same chains.

Each row prints samples/s over the steps after a warm-up (head rank 0's history), its
ratio to the in-cluster row of the same run, the bound worker's busy share across over
inside, the median step time, each side's share of its time spent computing (the rest is
waiting for the wire) and the final loss (``nebula_mq.bench.wan_report``). The links' shape is
put back as it was when the run ends. Worker processes import the frameworks; this module
does not.

With ``--repeats R`` the whole plan runs R times, each repeat starting with its own in-cluster
row (the WAN rows in reverse order every other repeat, so that a drift of the shared host's
speed does not favour one row); each WAN row's ratio is taken against its own repeat's
in-cluster row, and the table shows the medians with every repeat's ratio beside them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from nebula_mq.bench.runs import (add_stack_arguments, check_repeats, link_shapes, measure, numbers,
                                  published_bytes, put_back, row_overrides, rows_dir, run_row, sides, split_job,
                                  write_json)
from nebula_mq.bench.wan_report import report, shares, summary

if TYPE_CHECKING:
    from pathlib import Path

    from nebula_mq.study import auto
    from nebula_mq.study.rows import StudyRow

DEFAULT_RATES = "10,60"
DEFAULT_DELAYS = "20,100"


@dataclass(frozen=True)
class WireFactor:
    """A rate given as the uncompressed wire's multiple of the compute (``4x``)."""

    factor: float

    def __str__(self) -> str:
        return f"{self.factor:g}x"


Rate = float | WireFactor


RATES_EXPECTED = "Mbit/s or wire factors separated by commas, like 10,60 or 4x (the uncompressed wire 4x the compute)"


def link_rates(text: str) -> list[Rate]:
    """``10,60,4x`` as rates; anything else is a one-line ConfigError naming ``--rates``."""
    from nebula_mq.errors import ConfigError

    out: list[Rate] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = float(part.removesuffix("x"))
        except ValueError:
            raise ConfigError("<command line>", "--rates", RATES_EXPECTED, text) from None
        if not 0 < value < float("inf"):
            raise ConfigError("<command line>", "--rates", RATES_EXPECTED, text)
        out.append(WireFactor(value) if part.endswith("x") else value)
    if not out:
        raise ConfigError("<command line>", "--rates", RATES_EXPECTED, text)
    return out


def rate_name(rate: Rate) -> str:
    """The rate's part of a row's name: ``2.7mbit`` or ``4x``."""
    return str(rate) if isinstance(rate, WireFactor) else f"{rate:g}mbit"


def resolve(rate: Rate, found: Profile | None) -> float:
    """``rate`` in Mbit/s: a factor from what the in-cluster row measured."""
    if not isinstance(rate, WireFactor):
        return rate
    if found is None:
        raise RuntimeError("the in-cluster row runs before any WAN row")
    return float(f"{found.rate_for(rate.factor):.3g}")  # a link as one would write it


def factor_notes(rates: Sequence[Rate], found: Profile | None) -> list[str]:
    """A line under the table for each factor: the rate it became, and from what."""
    if found is None:
        return []
    return [f"{r}: {resolve(r, found):.3g} Mbit/s each way ({max(found.forward_bytes, found.backward_bytes) / 1e3:.0f} "
            f"kB uncompressed a step in the slower direction, {found.compute_s * 1000:.0f} ms of compute a step "
            f"in one cluster)" for r in rates if isinstance(r, WireFactor)]


@dataclass(frozen=True)
class Profile:
    """What the in-cluster (uncompressed) row measured."""

    compute_s: float  # the slower side's compute seconds per step
    forward_bytes: float  # the head's published bytes per step (activations)
    backward_bytes: float  # the tail's published bytes per step (gradients)
    shape: tuple[int, int, int]  # a typical activation, [B, S, H]

    def wire_factor(self, rate_mbit: float) -> float:
        """Uncompressed wire time of a step (the slower direction) over its compute: the paper's
        regime is about 4."""
        return max(self.forward_bytes, self.backward_bytes) * 8 / (rate_mbit * 1e6) / self.compute_s

    def rate_for(self, wire_factor: float) -> float:
        """The rate in Mbit/s at which :meth:`wire_factor` is ``wire_factor``."""
        return max(self.forward_bytes, self.backward_bytes) * 8 / (wire_factor * self.compute_s) / 1e6


def uncompressed() -> StudyRow:
    """The chains of a row that compresses nothing (``none`` / ``none``)."""
    from nebula_mq.study.rows import StudyRow

    return StudyRow("none", "none", origin="auto")


def row_codecs(settings: Any, row: StudyRow) -> dict[str, str]:
    """``NEBULA__`` overrides that make a job train with ``row``'s chains, from its first step."""
    env = {"NEBULA__CODEC__FORWARD": row.forward, "NEBULA__CODEC__BACKWARD": row.backward,
           "NEBULA__CODEC__COMPRESS_FROM_STEP": "0"}
    if settings.job.scenario == "abnet":
        env["NEBULA__ABNET__FORWARD_FEEDBACK"] = row.forward_feedback
        env["NEBULA__ABNET__BACKWARD_FEEDBACK"] = row.backward_feedback
    return env


def profile(settings: Any, run_dir: Path, steps: int, heads: list[str], tails: list[str],
            measured: dict[str, Any]) -> Profile:
    """The in-cluster row's :class:`Profile`: ``measured`` is its row (samples/s after the
    warm-up, samples, compute shares), the bytes come from its workers' metrics."""
    from nebula_mq.errors import WorkerError

    busiest = max(measured["compute_share"].values(), default=0.0)
    batch = max(1, round(measured["samples"] / steps))  # the global batch, as trained
    compute = batch / measured["samples_per_s"] * busiest if measured["samples_per_s"] else 0.0
    forward = sum(published_bytes(run_dir, w) for w in heads) / steps
    backward = sum(published_bytes(run_dir, w) for w in tails) / steps
    if compute <= 0 or forward <= 0:
        raise WorkerError(f"the in-cluster row left no compute time or activation bytes in {run_dir / 'metrics'}: "
                          "neither auto's chains nor a wire factor like 4x can be set from it")
    if settings.job.scenario == "abnet":
        from nebula_mq.models import abnet_config
        from nebula_mq.study import auto
        from workers.abnet.job import load_job  # paddle-free: the launcher reads it too

        shape = auto.activation_shape(forward, batch, abnet_config.preset(load_job(settings).preset).encoder.hidden)
    else:  # the user's model: its width is unknown, and only the element count sets the chains' cost
        shape = (batch, 1, max(1, round(forward / 4 / batch)))
    return Profile(compute, forward, backward, shape)


def pick(settings: Any, found: Profile, rate_mbit: float) -> auto.Choice:
    """The chains ``auto`` picks for a ``rate_mbit`` link, by the study's rule."""
    from nebula_mq.study import auto

    candidates = auto.DEFAULT_CANDIDATES
    if settings.job.scenario != "abnet":
        candidates = tuple(c for c in candidates if c.forward_feedback == c.backward_feedback == "none")
    return auto.pick(auto.LinkProfile(rate_mbit, found.compute_s, found.shape), candidates)


class AutoCodecs:
    """The chains of each row under ``--codecs auto``: uncompressed in one cluster, ``auto``'s
    pick for each WAN rate, chosen once from the first in-cluster row (:meth:`learn`)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.found: Profile | None = None
        self.picks: dict[float, auto.Choice] = {}

    def choice(self, rate_mbit: float | None) -> StudyRow:
        if rate_mbit is None:
            return uncompressed()
        if self.found is None:
            raise RuntimeError("the in-cluster row runs before any WAN row")
        if rate_mbit not in self.picks:
            self.picks[rate_mbit] = pick(self.settings, self.found, rate_mbit)
        return self.picks[rate_mbit].row

    def learn(self, found: Profile) -> None:
        """The first in-cluster row's profile: every pick is made from it."""
        if self.found is None:
            self.found = found

    def notes(self) -> list[str]:
        found = self.found
        if found is None:
            return []
        lines = [f"auto: in one cluster (uncompressed) {found.compute_s * 1000:.0f} ms of compute a step on the "
                 f"slower side, {found.forward_bytes / 1e3:.0f} kB of activations and {found.backward_bytes / 1e3:.0f} "
                 f"kB of gradients; activation {list(found.shape)}"]
        for rate, c in sorted(self.picks.items()):
            lines.append(f"auto at {rate:g} Mbit/s: {c.row.chain} (uncompressed wire {found.wire_factor(rate):.1f}x "
                         f"compute; estimated wire {c.wire_s * 1000:.0f} ms, codec {c.codec_s * 1000:.1f} ms, "
                         f"step {c.step_s * 1000:.0f} ms)")
        return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="job TOML file of a split or abnet job (its model, codecs and in_flight)")
    parser.add_argument("--steps", type=int, default=120, help="steps per row")
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the rate")
    parser.add_argument("--rates", default=DEFAULT_RATES,
                        help="WAN rates in Mbit/s each way, comma separated; 4x: the rate at which a step's "
                             "uncompressed wire takes 4x its compute in one cluster (the paper's regime; needs "
                             "--codecs none, auto, none,auto or none,job: the default, job, compresses in one cluster)")
    parser.add_argument("--delay-ms", default=DEFAULT_DELAYS, help="one-way WAN delays in ms, comma separated")
    parser.add_argument("--codecs", default="job", metavar="SETS",
                        help="job: the job's own chains in every row; auto: uncompressed in one cluster and "
                             "auto's pick for each WAN rate; none: uncompressed everywhere; none,auto or "
                             "none,job: both WAN rows at each rate and delay, beside one uncompressed "
                             "in-cluster row")
    parser.add_argument("--repeats", type=int, default=1,
                        help="times to run the whole plan, each with its own in-cluster row (medians reported)")
    add_stack_arguments(parser, "local stack directory, started if needed (default $NEBULA_RUN_DIR or run/stack)")


CODEC_SETS = ("job", "none", "auto")


def codec_sets(text: str) -> list[str]:
    """``--codecs``: ``job`` alone, any of ``none`` and ``auto``, or ``none,job`` (the in-cluster
    row of all but ``job`` alone is uncompressed); anything else is a one-line ConfigError."""
    from nebula_mq.errors import ConfigError

    sets = [v.strip() for v in text.split(",") if v.strip()]
    if not sets or any(v not in CODEC_SETS for v in sets) or len(set(sets)) < len(sets) \
            or ("job" in sets and len(sets) > 1 and sorted(sets) != ["job", "none"]):
        raise ConfigError("<command line>", "--codecs", "job, auto, none, none,auto or none,job", text)
    return sets


def row_env(settings: Any, name: str, steps: int, root: Path, local: bool) -> dict[str, str]:
    """``NEBULA__`` overrides that make the job file one row: its own id and run_dir, the steps,
    no evaluation at the end, and for the in-cluster row the tail on the head's cluster."""
    section = settings.job.scenario.upper()
    given = settings.scenario_section()
    slug = name.replace(".", "p")  # 2.7mbit-20ms: a job id has no dots
    env = row_overrides(f"{settings.job.id}-wan-{slug}", root / name, steps)
    if settings.job.scenario == "abnet":  # the rate is the training's: no row waits on a beam search at the end
        env[f"NEBULA__{section}__EVAL_SAMPLES"] = "0"
    if local:
        head = given.get("src_cluster", given.get("head_cluster", "cluster-a"))
        key = "TGT_CLUSTER" if "tgt_cluster" in given else "TAIL_CLUSTER"
        env[f"NEBULA__{section}__{key}"] = str(head)
    return env


def run(args: argparse.Namespace) -> int:
    from nebula_mq.stack import Stack

    settings = split_job(args.config)
    rates = link_rates("10" if args.quick else args.rates)
    delays = numbers("20" if args.quick else args.delay_ms, "--delay-ms", allow_zero=True)
    steps = 30 if args.quick else args.steps
    warmup = min(args.warmup, steps // 3)
    repeats = check_repeats(1 if args.quick else args.repeats)
    sets = codec_sets(args.codecs)
    factors = [r for r in rates if isinstance(r, WireFactor)]
    if sets == ["job"] and factors:
        from nebula_mq.errors import ConfigError

        raise ConfigError("<command line>", "--rates", "Mbit/s under --codecs job (the default): a factor like 4x "
                          "is measured on an uncompressed in-cluster row, so add --codecs none,job, none, auto or "
                          "none,auto", args.rates)
    from nebula_mq.study.rows import StudyRow

    codecs = AutoCodecs(settings) if "auto" in sets else None
    given = settings.scenario_section()
    own = StudyRow(settings.codec.forward, settings.codec.backward, origin="job",
                   compress_from_step=settings.codec.compress_from_step,
                   forward_feedback=given.get("forward_feedback", "none"),
                   backward_feedback=given.get("backward_feedback", "none")).chain
    rows: list[dict[str, Any]] = []
    shaped: Any = None
    before: dict[str, Any] = {}
    found: Profile | None = None  # the first in-cluster row's, for auto and wire factors
    try:
        with rows_dir("wan") as root:
            for repeat, name, spec, delay, chains in plan(rates, delays, repeats, sets):
                rate = None if spec is None else resolve(spec, found)
                if rate is not None:
                    if shaped is None:
                        shaped = Stack.open(args.stack)
                        before = link_shapes(shaped)
                    shaped.link_up(None, rate_mbit=rate, delay_ms=delay)
                elif shaped is not None:  # every in-cluster row on the links as they were
                    put_back(shaped, before)
                tag = name if repeats == 1 else f"{name}-r{repeat}"
                if sets == ["job"] or chains == "job":
                    env_codecs, label = {}, own
                else:  # auto's pick, or nothing compressed ("none", and every in-cluster row beside none)
                    chosen = codecs.choice(rate) if chains == "auto" and codecs is not None else uncompressed()
                    env_codecs, label = row_codecs(settings, chosen), chosen.chain
                env = row_env(settings, tag, steps, root, rate is None) | env_codecs
                job = run_row(args.config, args.stack, env, args.timeout)
                heads, tails = sides(job.plan)
                row = {"row": name, "repeat": repeat, "rate_mbit": rate, "delay_ms": delay,
                       **measure(job.run_dir, heads[0], warmup, (heads, tails)),
                       "compute_share": shares(job.run_dir), "head": heads[0]}
                if found is None and (codecs is not None or factors):  # the in-cluster row: uncompressed
                    found = profile(settings, job.run_dir, steps, heads, tails, row)
                    if codecs is not None:
                        codecs.learn(found)
                row["codecs"] = label
                rows.append(row)
                print(f"{tag}: {row['samples_per_s']:.1f} samples/s", flush=True)
    finally:  # a row that failed or a stopped run prints what the finished rows measured
        if shaped is not None:
            put_back(shaped, before)
        if rows:
            print(report(settings, rows, steps, warmup, table_notes(sets, codecs, factor_notes(factors, found))),
                  flush=True)
    # The profile is what auto's picks and any wire factor's rate were set from.
    write_json(args.json, {"steps": steps, "warmup": warmup, "repeats": repeats, "rows": rows,
                           "summary": summary(rows), "profile": found and asdict(found)})
    return 0


def table_notes(sets: list[str], codecs: Any, rate_notes: list[str]) -> list[str] | None:
    """The lines under the table about each row's link and chains; None when every row runs the
    job's own chains (the table then names them in its header), on rates given in Mbit/s."""
    if sets == ["job"]:
        return None
    return rate_notes + (codecs.notes() if codecs is not None else [])


PlanRow = tuple[int, str, Rate | None, float | None, str | None]


def plan(rates: list[Rate], delays: list[float], repeats: int, sets: list[str] | None = None) -> list[PlanRow]:
    """(repeat, row name, rate, delay, codec set) in the order run: each repeat its in-cluster
    row first (no set), then the WAN rows, one per rate, delay and set (a set's name ends the
    row's when there are several), reversed every other repeat."""
    sets = sets or ["job"]
    wan: list[tuple[str, Rate | None, float | None, str | None]] = [
        (f"{rate_name(r)}-{d:g}ms" + (f"-{c}" if len(sets) > 1 else ""), r, d, c)
        for r in rates for d in delays for c in sets]
    return [(repeat, *row) for repeat in range(repeats)
            for row in [("in-cluster", None, None, None)] + (wan if repeat % 2 == 0 else wan[::-1])]
