"""The evaluation of a run (``<run_dir>/eval.json``, written by T) for people to read.

Scores per domain (BLEU and chrF, case-insensitive, as sacrebleu computes
them), then a few example translations drawn from every domain, each beside
its reference (and its source where the caller has it: T never holds sources,
but ``nebula-mq run`` on one machine does). The HTML section puts the loss
curves beside the scores: a score is read against how training went.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nebula_mq.report.html_parts import e, figure, num, table

EXAMPLES_PER_DOMAIN = 3


def domain_rows(body: Mapping[str, Any]) -> list[tuple[str, int, float, float]]:
    """(domain, sentences, BLEU, chrF), ``all`` first."""
    by_domain: Mapping[str, Mapping[str, float]] = body.get("by_domain") or {}
    names = sorted(by_domain, key=lambda d: (d != "all", d))
    return [(d, int(by_domain[d].get("sentences", 0)), float(by_domain[d]["bleu"]), float(by_domain[d]["chrf"]))
            for d in names]


def examples(body: Mapping[str, Any], per_domain: int = EXAMPLES_PER_DOMAIN) -> list[dict[str, Any]]:
    """A few hypotheses of every domain with their references (spread over the sample)."""
    hyps: Sequence[str] = body.get("hypotheses") or []
    refs: Sequence[str] = body.get("references") or []
    domains: Sequence[str] = body.get("domains") or ["all"] * len(hyps)
    ids: Sequence[int] = body.get("sample_ids") or list(range(len(hyps)))
    sources: Sequence[str] | None = body.get("sources")
    out: list[dict[str, Any]] = []
    for name in sorted(set(domains)):
        rows = [i for i, d in enumerate(domains) if d == name]
        step = max(1, len(rows) // per_domain)
        for i in rows[::step][:per_domain]:
            out.append({"domain": name, "sample_id": ids[i], "hypothesis": hyps[i], "reference": refs[i],
                        "source": sources[i] if sources else None})
    return out


def copy_source_bleu(body: Mapping[str, Any], sources: Mapping[int, str]) -> dict[str, float]:
    """BLEU per domain of returning each source sentence unchanged: the floor a model must
    clear (software messages share names, numbers and markup with their translations).
    Empty when a sentence's source is missing (T alone never holds sources)."""
    from nebula_mq.evaluation.bleu import bleu_by_domain

    ids: Sequence[int] = body.get("sample_ids") or []
    if not ids or any(int(i) not in sources for i in ids):
        return {}
    return bleu_by_domain([sources[int(i)] for i in ids], list(body.get("references") or []),
                          list(body.get("domains") or ["all"] * len(ids)))


def summary_text(body: Mapping[str, Any], sources: Mapping[int, str] | None = None) -> str:
    """Plain-text scores and examples, for the end of ``nebula-mq run``; with the sources,
    the copy-source floor per domain beside the scores."""
    floor = copy_source_bleu(body, sources) if sources else {}
    lines = [f"evaluation: {body.get('split', '?')} split, {body.get('samples', 0)} sentences, "
             f"beam {body.get('beam', '?')} (case-insensitive sacrebleu)",
             f"  {'domain':<10} {'sentences':>9} {'BLEU':>6} {'chrF':>6}" + (f" {'copy-source BLEU':>17}" if floor else "")]
    lines += [f"  {d:<10} {n:>9} {b:>6.2f} {c:>6.2f}" + (f" {floor[d]:>17.2f}" if d in floor else "")
              for d, n, b, c in domain_rows(body)]
    lines.append("examples:")
    for ex in examples(body):
        source = ex["source"] or (sources or {}).get(int(ex["sample_id"]))
        if source:
            lines.append(f"  [{ex['domain']}] source:     {source}")
        lines.append(f"  [{ex['domain']}] reference:  {ex['reference']}")
        lines.append(f"  [{ex['domain']}] hypothesis: {ex['hypothesis']}")
    return "\n".join(lines)


def evaluation_section(body: Mapping[str, Any] | None, training_png: bytes | None) -> str:
    if not body:
        return ('<p class="empty">No eval.json in the run directory: the job has not evaluated yet '
                "(set <code>[abnet] eval_samples</code>, or run <code>nebula-mq eval</code>).</p>")
    scores = table(["domain", "sentences", "BLEU", "chrF"],
                   [(e(d), num(n), f"{b:.2f}", f"{c:.2f}") for d, n, b, c in domain_rows(body)])
    has_source = any(ex["source"] for ex in examples(body))
    columns = ["domain", *(["source"] if has_source else []), "reference", "hypothesis"]
    rows = [(e(ex["domain"]), *([e(ex["source"] or "")] if has_source else []), e(ex["reference"]),
             e(ex["hypothesis"])) for ex in examples(body)]
    head = (f"<p>{e(str(body.get('split', '?')))} split, {num(body.get('samples', 0))} sentences, beam "
            f"{e(str(body.get('beam', '?')))}; BLEU and chrF are sacrebleu's, case-insensitive.</p>")
    curves = figure(training_png, "training values per step", "The loss curves of the same run.",
                    "No training curves.")
    return (f'{head}<div class="side-by-side"><div>{scores}<h3>Examples</h3>'
            f'{table(columns, rows, numeric=())}</div><div>{curves}</div></div>')
