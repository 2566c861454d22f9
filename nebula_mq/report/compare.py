"""Two runs of one job side by side: ``nebula-mq compare BASELINE SYSTEM``.

It answers the question compression raises: does the compressed run translate as well
as the uncompressed one, and how much less did it send? Each run's evaluation
(``eval.json``, written by T) holds every hypothesis beside its reference. Two runs are
comparable when they decoded the same sentences: the same split, sample ids and
references. BLEU and chrF are then compared by sacrebleu's paired bootstrap over all
sentences and per domain. Beside the scores stand the bytes each run put on the wire
per training step, from its workers' counters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nebula_mq.errors import DataError
from nebula_mq.evaluation.bleu import PairedResult, domain_groups, paired_test
from nebula_mq.report.derive import wire_bytes_per_step
from nebula_mq.report.records import RunData


@dataclass(frozen=True)
class DomainComparison:
    domain: str
    sentences: int
    bleu: PairedResult
    chrf: PairedResult


@dataclass(frozen=True)
class Traffic:
    steps: int
    # What every worker published per step of its current process (its counters restart with
    # it), summed over the workers: each message once, on its sender. The evaluation's
    # activations count too: a few percent of an ABNet run's messages.
    wire_per_step: float
    raw_per_step: float


def evaluation(run: RunData) -> Mapping[str, Any]:
    """The run's evaluation body; DataError (one line) when it has none."""
    body = run.evaluation
    if body is None or not body.get("hypotheses"):
        unreadable = [p for p in run.problems if p.startswith("eval.json")]
        if unreadable:
            raise DataError(f"{run.run_dir}: {unreadable[0]}")
        raise DataError(f"{run.run_dir}: no evaluation (eval.json) to compare; a job writes it after its "
                        "last step when [abnet] eval_samples > 0")
    return body


def check_comparable(base: Mapping[str, Any], system: Mapping[str, Any]) -> None:
    """The two evaluations decoded the same sentences, or DataError saying how they differ."""
    if base.get("split") != system.get("split"):
        raise DataError(f"the runs were evaluated on different splits ({base.get('split')!r}, "
                        f"{system.get('split')!r})")
    if list(base.get("sample_ids") or []) != list(system.get("sample_ids") or []):
        raise DataError(f"the runs decoded different sentences ({len(base.get('sample_ids') or [])} and "
                        f"{len(system.get('sample_ids') or [])} sample ids, or the same count in another order): "
                        "compare runs of one job with the same eval_samples")
    if list(base.get("references") or []) != list(system.get("references") or []):
        raise DataError("the runs' references differ: they were built from different data")


def compare_scores(base: Mapping[str, Any], system: Mapping[str, Any],
                   samples: int = 1000) -> list[DomainComparison]:
    """Paired bootstrap of BLEU and chrF over all sentences, then per domain (sorted)."""
    check_comparable(base, system)
    hyp_a, hyp_b, refs = list(base["hypotheses"]), list(system["hypotheses"]), list(base["references"])
    domains: Sequence[str] = base.get("domains") or ["all"] * len(refs)
    out = []
    for name, idx in domain_groups(hyp_a, refs, domains).items():
        if name != "all" and len(idx) == len(refs):
            continue  # one domain: the same sentences as "all"
        tests = paired_test([hyp_a[i] for i in idx], [hyp_b[i] for i in idx], [refs[i] for i in idx], samples)
        out.append(DomainComparison(name, len(idx), tests["BLEU"], tests["chrF"]))
    return out


def traffic(run: RunData) -> Traffic:
    """Bytes each worker published per step of its current process, summed; the job's step."""
    metrics = [w.metrics for w in run.workers.values() if w.metrics is not None]
    wire = sum(wire_bytes_per_step(m) or 0.0 for m in metrics)
    raw = sum(wire_bytes_per_step(m, raw=True) or 0.0 for m in metrics)
    steps = max((w.status.step for w in run.workers.values() if w.status is not None), default=0)
    return Traffic(int(steps), wire, raw)


def comparison_body(base: RunData, system: RunData, samples: int = 1000) -> dict[str, Any]:
    """What ``--json`` prints: the runs, the scores per domain, the traffic."""
    body_a, body_b = evaluation(base), evaluation(system)
    rows = compare_scores(body_a, body_b, samples)
    sent = {name: traffic(run) for name, run in (("baseline", base), ("system", system))}
    return {
        "baseline": str(base.run_dir), "system": str(system.run_dir), "bootstrap_samples": samples,
        "split": body_a.get("split"),
        "scores": [asdict(r) for r in rows],
        "traffic": {name: asdict(t) for name, t in sent.items()},
    }


def render(body: Mapping[str, Any]) -> str:
    """The comparison as a plain-text table."""
    lines = [f"baseline {body['baseline']}", f"system   {body['system']}",
             f"{body['split']} split, paired bootstrap ({body['bootstrap_samples']} resamples); "
             "p: the chance of a difference this large between equal systems; ±: half the 95% interval "
             "of the system's own score", "",
             f"{'domain':<10} {'sentences':>9}  {'BLEU':>6} {'BLEU':>14} {'p':>6}  {'chrF':>6} {'chrF':>14} {'p':>6}",
             f"{'':<10} {'':>9}  {'base':>6} {'system (±95%)':>14} {'':>6}  {'base':>6} {'system (±95%)':>14} {'':>6}"]
    for r in body["scores"]:
        b, c = r["bleu"], r["chrf"]
        lines.append(f"{r['domain']:<10} {r['sentences']:>9}  {b['baseline']:>6.2f} "
                     f"{b['system']:>7.2f} ±{b['system_ci']:<5.2f} {b['p_value']:>6.3f}  "
                     f"{c['baseline']:>6.2f} {c['system']:>7.2f} ±{c['system_ci']:<5.2f} {c['p_value']:>6.3f}")
    t_base, t_sys = body["traffic"]["baseline"], body["traffic"]["system"]
    lines.append("")
    for name, t in (("baseline", t_base), ("system", t_sys)):
        ratio = t["raw_per_step"] / t["wire_per_step"] if t["wire_per_step"] else 0.0
        lines.append(f"{name:<9} {t['steps']} steps, {t['wire_per_step'] / 1e3:,.1f} kB on the wire per step "
                     f"(raw / wire {ratio:.2f}x)")
    if t_sys["wire_per_step"] > 0 and t_base["wire_per_step"] > 0:
        ratio = t_base["wire_per_step"] / t_sys["wire_per_step"]
        lines.append(f"the system sent {ratio:.2f}x fewer bytes per step" if ratio >= 1 else
                     f"the system sent {1 / ratio:.2f}x more bytes per step")
        lines[-1] += " (every message, the evaluation's included)"
    return "\n".join(lines)


def compare_runs(base_dir: Path, system_dir: Path, samples: int = 1000) -> dict[str, Any]:
    from nebula_mq.report.parse import load_run

    return comparison_body(load_run(base_dir), load_run(system_dir), samples)
