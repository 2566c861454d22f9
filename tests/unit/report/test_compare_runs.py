"""``nebula-mq compare``: two runs' evaluations scored against each other, and their traffic."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nebula_mq.cli import main as cli_main
from nebula_mq.errors import DataError
from nebula_mq.evaluation.bleu import evaluation_body, paired_test
from nebula_mq.report.compare import check_comparable, compare_runs

REFS = [f"the message number {i} could not be {'saved' if i % 2 else 'opened'} by the user" for i in range(60)]
DOMAINS = ["bible" if i % 3 == 0 else "gettext" for i in range(60)]


def write_run(run_dir: Path, hyps: list[str], write_metrics: Callable[..., None], wire: int,
              ids: list[int] | None = None, steps: int = 50) -> Path:
    ids = ids if ids is not None else list(range(len(hyps)))
    body = evaluation_body("test", ids, hyps, [REFS[i] for i in ids], [DOMAINS[i] for i in ids], beam=4)
    run_dir.mkdir(parents=True)
    (run_dir / "eval.json").write_text(json.dumps(body))
    write_metrics(run_dir, {"enc-0": {("activations", "out"): steps, ("reply-enc-0", "in"): steps},
                            "dec-0": {("activations", "in"): steps, ("reply-enc-0", "out"): steps}},
                  raw=1000, wire=wire, steps=steps)
    for worker in ("enc-0", "dec-0"):
        (run_dir / "status" / f"{worker}.json").parent.mkdir(exist_ok=True)
        (run_dir / "status" / f"{worker}.json").write_text(json.dumps(
            {"worker": worker, "state": "finished", "step": steps, "updated": 1.0}))
    return run_dir


def test_a_worse_system_is_significant_overall_and_per_domain_with_its_traffic(
        tmp_path: Path, write_metrics: Callable[..., None], capsys: pytest.CaptureFixture[str]) -> None:
    broken = [r.replace("saved", "lost").replace("user", "owner") for r in REFS]
    base = write_run(tmp_path / "base", list(REFS), write_metrics, wire=1000)
    system = write_run(tmp_path / "int4", broken, write_metrics, wire=125)
    body = compare_runs(base, system, samples=200)
    rows = {r["domain"]: r for r in body["scores"]}
    assert list(rows) == ["all", "bible", "gettext"]
    assert rows["all"]["sentences"] == 60 and rows["bible"]["sentences"] == 20
    for row in rows.values():
        for metric in ("bleu", "chrf"):
            assert row[metric]["baseline"] == pytest.approx(100.0)
            assert row[metric]["system"] < 100.0 and row[metric]["p_value"] < 0.05
    assert body["traffic"]["baseline"]["wire_per_step"] == pytest.approx(2 * 1000)  # one message each way
    assert body["traffic"]["system"]["wire_per_step"] == pytest.approx(2 * 125)
    assert cli_main(["compare", str(base), str(system), "--bootstrap", "50",
                     "--json-out", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "8.00x fewer bytes per step" in out and out.splitlines()[6].startswith("all")
    assert json.loads((tmp_path / "c.json").read_text())["bootstrap_samples"] == 50


def test_a_run_against_itself_is_no_difference_and_a_restart_keeps_bytes_per_step(
        tmp_path: Path, write_metrics: Callable[..., None]) -> None:
    base = write_run(tmp_path / "base", list(REFS), write_metrics, wire=1000)
    body = compare_runs(base, base, samples=100)
    assert all(r[m]["p_value"] == 1.0 for r in body["scores"] for m in ("bleu", "chrf"))
    # A worker that restarted near the end: its counters cover its own 5 steps, not the job's 50.
    write_metrics(base, {"dec-0": {("reply-enc-0", "out"): 5}}, raw=1000, wire=1000, steps=5)
    assert compare_runs(base, base, samples=10)["traffic"]["system"]["wire_per_step"] == pytest.approx(2000)


def test_paired_test_finds_no_difference_between_near_equal_systems() -> None:
    near = list(REFS)
    near[0], near[1] = near[0].replace("opened", "closed"), near[1].replace("saved", "kept")
    other = list(REFS)
    other[2], other[3] = other[2].replace("opened", "closed"), other[3].replace("saved", "kept")
    tests = paired_test(near, other, REFS, samples=200)
    assert set(tests) == {"BLEU", "chrF"}
    assert all(t.p_value > 0.1 for t in tests.values())
    with pytest.raises(DataError, match="unknown metric"):
        paired_test(near, other, REFS, metrics=("TER",))


def test_runs_that_decoded_different_sentences_are_refused_in_one_line(
        tmp_path: Path, write_metrics: Callable[..., None], capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run(tmp_path / "base", REFS[:40], write_metrics, wire=1000)
    other = write_run(tmp_path / "other", REFS[10:50], write_metrics, wire=1000, ids=list(range(10, 50)))
    assert cli_main(["compare", str(base), str(other)]) == 1
    err = capsys.readouterr().err
    assert "decoded different sentences" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "status").mkdir()
    assert cli_main(["compare", str(base), str(tmp_path / "none")]) == 1
    assert "no evaluation (eval.json)" in capsys.readouterr().err
    with pytest.raises(DataError, match="different splits"):
        check_comparable({"split": "test"}, {"split": "valid"})
    (tmp_path / "other" / "eval.json").write_text("{not json")
    assert cli_main(["compare", str(base), str(tmp_path / "other")]) == 1
    assert "eval.json" in capsys.readouterr().err
    assert cli_main(["compare", str(base), str(base), "--bootstrap", "0"]) == 1
    assert "--bootstrap" in capsys.readouterr().err
