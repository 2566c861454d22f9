"""Evaluation across the clusters: S sends kind=eval activations, T beam-decodes and scores BLEU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from nebula_mq.errors import DataError
from nebula_mq.evaluation.bleu import (SymbolDetokenizer, WordPieceDetokenizer, bleu_by_domain, corpus_bleu,
                                  paired_bootstrap)


def test_wordpiece_detokenizer_restores_words_and_lowercases() -> None:
    from nebula_mq.data.tokenizers import load_minilm_tokenizer

    text = "The Lord's well-known Words, said unto Nehemiah: go!"
    ids = load_minilm_tokenizer().encode(text).ids
    assert WordPieceDetokenizer()([ids]) == ["the lord's well-known words, said unto nehemiah : go!"]
    # Case-insensitive BLEU: the detokenized hypothesis matches the cased reference exactly.
    assert corpus_bleu(WordPieceDetokenizer()([ids]), [text]) == pytest.approx(100.0)


def test_bleu_per_domain_and_paired_bootstrap() -> None:
    refs = [f"sentence number {i} about the law and the prophets" for i in range(40)]
    domains = ["bible" if i % 2 else "gettext" for i in range(40)]
    good = list(refs)
    bad = [r.replace("law", "lamb").replace("prophets", "profits") if i % 2 else r for i, r in enumerate(refs)]
    scores = bleu_by_domain(bad, refs, domains)
    assert scores["gettext"] == pytest.approx(100.0) and scores["bible"] < 60 < scores["all"] < 100
    # One sentence fixed and one broken: no real difference. (sacrebleu reports the
    # minimum p for two *identical* systems, so the near-tie is the meaningful check.)
    near = list(bad)
    near[1], near[0] = refs[1], near[0].replace("law", "lamb")
    tie = paired_bootstrap(bad, near, refs, samples=200)
    better = paired_bootstrap(bad, good, refs, samples=200)
    assert tie.p_value > 0.1 and better.p_value < 0.05 and better.system > better.baseline
    with pytest.raises(DataError):
        corpus_bleu(["a"], ["a", "b"])


def test_the_run_summary_shows_the_copy_source_floor_per_domain_when_it_has_the_sources() -> None:
    from nebula_mq.evaluation.bleu import evaluation_body
    from nebula_mq.report.evaluation import copy_source_bleu, summary_text

    refs = ["could not open the file", "Save the file as a new document", "and god said let there be light",
            "the lord is my shepherd"]
    # Software messages keep names and markup, sometimes whole strings: copying scores above zero.
    srcs = {10: "no se pudo abrir el file", 11: "save the file as a new document", 12: "y dijo dios",
            13: "jehova es mi pastor"}
    body = evaluation_body("test", [10, 11, 12, 13], ["could not open the file", "save the file", "and god said",
                                                     "the lord"], refs, ["gettext", "gettext", "bible", "bible"], beam=4)
    floor = copy_source_bleu(body, srcs)
    assert set(floor) == {"all", "bible", "gettext"}
    assert floor["bible"] == pytest.approx(bleu_by_domain(["y dijo dios", "jehova es mi pastor"], refs[2:],
                                                          ["bible"] * 2)["bible"])
    assert 0 < floor["gettext"] < 100 and floor["bible"] < floor["gettext"]
    text = summary_text(body, srcs)
    assert "copy-source BLEU" in text and f"{floor['gettext']:.2f}" in text
    # T's own view (no sources) shows no floor rather than a wrong one.
    assert copy_source_bleu(body, {10: "x"}) == {} and "copy-source" not in summary_text(body)


@pytest.mark.paddle
def test_trained_pipeline_beam_decodes_eval_split_on_t(tmp_path: Path) -> None:
    from nebula_mq.transport.memory import MemoryBroker
    from tests.fixtures.pairs import abnet_settings as tiny_settings
    from tests.fixtures.pairs import run_abnet_pair as run_pair

    def run(steps: int, where: Path) -> dict[str, object]:
        base = tiny_settings(where, steps=steps)
        settings = dataclasses.replace(base, abnet={**base.section("abnet"), "lr": 3e-3, "eval_samples": 40, "eval_beam": 2,
                                                    "eval_max_len": 12})
        run_pair(settings, MemoryBroker())
        return json.loads((where / "eval.json").read_text())

    trained, untrained = run(200, tmp_path / "trained"), run(1, tmp_path / "untrained")
    assert trained["samples"] == 40  # 3 batches of 16, the last one partial
    assert len(trained["hypotheses"]) == len(trained["references"]) == 40  # type: ignore[arg-type]
    assert set(trained["bleu_by_domain"]) == {"all", "synthetic"}  # type: ignore[arg-type]
    # References come from T's own (test-split) targets, not from the training split.
    detok = SymbolDetokenizer()
    assert trained["references"][0] != ""  # type: ignore[index]
    assert trained["references"][0].startswith("w") and detok([[1, 2]]) == [""]  # type: ignore[index,union-attr]
    assert trained["bleu"] > untrained["bleu"] + 10  # type: ignore[operator]
