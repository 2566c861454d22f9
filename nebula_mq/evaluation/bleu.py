"""Case-insensitive BLEU as in the paper (§4.2), per domain, with paired bootstrap resampling.

Everything is sacrebleu's: ``BLEU(lowercase=True)`` (13a tokenisation) and
:class:`sacrebleu.significance.PairedTest` with ``test_type="bs"`` for
comparing a system with a baseline on the same references.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nebula_mq.errors import DataError


class Detokenizer(Protocol):
    def __call__(self, ids: Sequence[Sequence[int]]) -> list[str]: ...


# BERT's pre-tokenizer splits every punctuation mark, and its decoder puts a space back
# around apostrophes and hyphens ("don ' t", "well - known"), which BLEU's 13a tokenizer
# would count as three tokens against the reference's one.
_INNER_MARK = re.compile(r"(?<=\w) ?(['\-]) ?(?=\w)")


class WordPieceDetokenizer:
    """MiniLM ids -> text through the tokenizer's own WordPiece decoder (joins ``##``
    pieces, drops special tokens, cleans up spaces before punctuation), lowercased,
    with word-internal apostrophes and hyphens re-attached."""

    def __init__(self) -> None:
        from nebula_mq.data.tokenizers import load_minilm_tokenizer

        self.tokenizer = load_minilm_tokenizer()

    def __call__(self, ids: Sequence[Sequence[int]]) -> list[str]:
        texts = self.tokenizer.decode_batch([list(map(int, row)) for row in ids], skip_special_tokens=True)
        return [_INNER_MARK.sub(r"\1", t.lower()) for t in texts]


class SymbolDetokenizer:
    """Synthetic task: each id is a word (``w17``); ids below ``first_word`` (pad/BOS/EOS) vanish."""

    def __init__(self, first_word: int = 3) -> None:
        self.first_word = first_word

    def __call__(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return [" ".join(f"w{int(i)}" for i in row if int(i) >= self.first_word) for row in ids]


# sacrebleu's metrics, each case-insensitive like the paper's BLEU.
METRICS = ("BLEU", "chrF")


def _metric(name: str) -> Any:
    from sacrebleu.metrics import BLEU, CHRF

    return (BLEU if name == "BLEU" else CHRF)(lowercase=True)


def _corpus_score(name: str, hypotheses: Sequence[str], references: Sequence[str]) -> float:
    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not references:
        raise DataError("scores of an empty test set")
    return float(_metric(name).corpus_score(list(hypotheses), [list(references)]).score)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    return _corpus_score("BLEU", hypotheses, references)


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """sacrebleu's chrF (character n-gram F-score)."""
    return _corpus_score("chrF", hypotheses, references)


def domain_groups(hypotheses: Sequence[str], references: Sequence[str],
                  domains: Sequence[str]) -> dict[str, list[int]]:
    """Sentence indices of ``all``, then of each domain in name order."""
    if not len(hypotheses) == len(references) == len(domains):
        raise DataError("hypotheses, references and domains differ in length")
    groups = {"all": list(range(len(references)))}
    for name in sorted(set(domains)):
        groups[name] = [i for i, d in enumerate(domains) if d == name]
    return groups


def scores_by_domain(hypotheses: Sequence[str], references: Sequence[str],
                     domains: Sequence[str]) -> dict[str, dict[str, float]]:
    """``{domain: {"bleu", "chrf", "sentences"}}`` for every domain plus ``all``."""
    out: dict[str, dict[str, float]] = {}
    for name, idx in domain_groups(hypotheses, references, domains).items():
        hyp, ref = [hypotheses[i] for i in idx], [references[i] for i in idx]
        out[name] = {"bleu": corpus_bleu(hyp, ref), "chrf": corpus_chrf(hyp, ref), "sentences": float(len(idx))}
    return out


def bleu_by_domain(hypotheses: Sequence[str], references: Sequence[str],
                   domains: Sequence[str]) -> dict[str, float]:
    """BLEU of every domain (e.g. gettext, bible) plus ``all``."""
    return {name: corpus_bleu([hypotheses[i] for i in idx], [references[i] for i in idx])
            for name, idx in domain_groups(hypotheses, references, domains).items()}


def evaluation_body(split: str, sample_ids: list[int], hypotheses: list[str], references: list[str],
                    domains: list[str], beam: int) -> dict[str, Any]:
    """What ``<run_dir>/eval.json`` holds: BLEU and chrF overall and per domain (``by_domain``),
    the number of sentences, and every hypothesis beside its reference and domain."""
    scores = scores_by_domain(hypotheses, references, domains)
    return {
        "split": split, "samples": len(sample_ids), "beam": beam,
        "bleu": scores["all"]["bleu"], "chrf": scores["all"]["chrf"], "by_domain": scores,
        "bleu_by_domain": {d: v["bleu"] for d, v in scores.items()},
        "sample_ids": sample_ids, "domains": domains, "hypotheses": hypotheses, "references": references,
    }


@dataclass(frozen=True)
class PairedResult:
    # The metric's score of the baseline and of the system, on all sentences.
    baseline: float
    system: float
    # p-value of "the system is no different from the baseline" under paired bootstrap.
    p_value: float
    # Half-width of the 95% confidence interval of the system's bootstrap score.
    system_ci: float


def paired_test(baseline: Sequence[str], system: Sequence[str], references: Sequence[str],
                samples: int = 1000, metrics: Sequence[str] = ("BLEU", "chrF")) -> dict[str, PairedResult]:
    """sacrebleu's paired bootstrap resampling (Koehn 2004) of each of ``metrics`` (BLEU, chrF;
    both case-insensitive), all on the same resamples."""
    from sacrebleu.significance import PairedTest

    if not len(baseline) == len(system) == len(references):
        raise DataError("paired bootstrap needs equal numbers of sentences")
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise DataError(f"unknown metric {unknown[0]!r} (known: {', '.join(METRICS)})")
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))],
                      {m: _metric(m) for m in metrics},
                      references=[list(references)], test_type="bs", n_samples=samples)
    _, results = test()
    # One column per metric after "System", in the given order, named by sacrebleu (chrF: "chrF2").
    columns = [k for k in results if k != "System"]
    # Identical outputs: every resampled difference is 0 and sacrebleu reports its smallest p,
    # 1 / (n + 1); no resample can show a difference, so p is 1.
    same = list(baseline) == list(system)
    out = {}
    for m, column in zip(metrics, columns, strict=True):
        base: Any = results[column][0]
        sys_: Any = results[column][1]
        out[m] = PairedResult(float(base.score), float(sys_.score), 1.0 if same else float(sys_.p_value),
                              float(sys_.ci))
    return out


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str], references: Sequence[str],
                     samples: int = 1000) -> PairedResult:
    """sacrebleu's paired bootstrap resampling (Koehn 2004), case-insensitive BLEU."""
    return paired_test(baseline, system, references, samples, ("BLEU",))["BLEU"]
