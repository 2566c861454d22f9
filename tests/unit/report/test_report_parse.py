"""Parsers and derived figures of ``nebula-mq report`` (no browser, no broker)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq.cli import main as cli_main
from nebula_mq.errors import DataError
from nebula_mq.report import derive
from nebula_mq.report.parse import (
    load_run, read_faults, read_history, read_prometheus, read_status, read_study,
)
from nebula_mq.runtime.hooks import MessageEvent
from nebula_mq.runtime.metrics import MetricsHook

flows = st.sampled_from(["activations", "reply-enc-s0", "grads"])
events = st.lists(st.tuples(flows, st.sampled_from(["out", "in"]), st.integers(0, 10**7), st.integers(1, 10**6)),
                  max_size=30)


@settings(max_examples=40, deadline=None)
@given(events=events, steps=st.integers(0, 50), compute=st.floats(0, 1e4), dead=st.integers(0, 5))
def test_prometheus_text_of_a_real_metrics_hook_reads_back_exactly(
        tmp_path_factory: pytest.TempPathFactory, events: list[tuple[str, str, int, int]], steps: int,
        compute: float, dead: int) -> None:
    path = tmp_path_factory.mktemp("prom") / "w.prom"
    hook = MetricsHook("role", path)
    for flow, direction, raw, wire in events:
        event = MessageEvent(flow, raw_bytes=raw, wire_bytes=wire)
        (hook.on_published if direction == "out" else hook.on_received)(event)
    for step in range(steps):
        hook.on_step(step, {"loss": 1.0 / (step + 1)})
    for _ in range(dead):
        hook.on_dead_letter(MessageEvent("grads"), "bad_checksum", "x")
    hook.on_compute(compute)
    hook.flush()
    m = read_prometheus(path.read_text(), "w.prom")
    expect_raw: dict[tuple[str, str], float] = {}
    expect_msgs: dict[tuple[str, str], float] = {}
    for flow, direction, raw, _ in events:
        expect_raw[(flow, direction)] = expect_raw.get((flow, direction), 0) + raw
        expect_msgs[(flow, direction)] = expect_msgs.get((flow, direction), 0) + 1
    assert m.steps == steps and m.raw_bytes == expect_raw and m.messages == expect_msgs
    assert math.isclose(m.compute_s, compute, rel_tol=1e-12, abs_tol=1e-12)
    assert m.dead_letters == ({("grads", "bad_checksum"): dead} if dead else {})
    assert m.values == ({"loss": 1.0 / steps} if steps else {})
    assert m.started is not None and m.started > 1.5e9


@pytest.mark.parametrize("text", ["garbage here {{", "# TYPE x counter\nx_total 1\n"])
def test_prometheus_text_that_is_not_a_worker_file_is_a_data_error(text: str) -> None:
    with pytest.raises(DataError, match="w.prom"):
        read_prometheus(text, "w.prom")


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.integers(0, 40), min_size=1, max_size=60), cut=st.integers(1, 30))
def test_history_keeps_the_last_row_of_each_step_in_step_order(steps: list[int], cut: int) -> None:
    lines = [json.dumps({"step": s, "time": 1000.0 + i, "loss": float(i)}) for i, s in enumerate(steps)]
    text = "\n".join(lines) + "\n" + lines[-1][:cut]  # a torn last write (killed worker)
    rows, skipped = read_history(text, "h.jsonl")
    last = {s: i for i, s in enumerate(steps)}
    assert [int(r["step"]) for r in rows] == sorted(last)
    assert [r["loss"] for r in rows] == [float(last[s]) for s in sorted(last)]
    assert len(skipped) == 1 and skipped[0].startswith("h.jsonl:")


def test_history_without_any_readable_row_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no readable history rows"):
        read_history('{"loss": 1}\nnot json\n', "h.jsonl")
    assert read_history("\n\n", "h.jsonl") == ((), [])


def test_status_faults_and_study_readers_accept_the_documented_shapes() -> None:
    status = read_status(json.dumps({"worker": "w", "role": "r", "cluster": "s", "job": "j", "pid": 7,
                                     "state": "running", "step": 3, "updated": 5.5, "values": {"loss": 2}}), "s")
    assert (status.state, status.step, status.values) == ("running", 3, {"loss": 2.0})
    faults = read_faults('{"time": 9, "kind": "kill", "target": "dec", "recovered_after_s": null}\n'
                         '{"time": 3, "kind": "wan_cut", "target": "s<->t", "recovered_after_s": 4.5}\n', "f")
    assert [(f.kind, f.recovered_after_s) for f in faults] == [("wan_cut", 4.5), ("kill", None)]
    one = {"chain": "fp16", "bleu": 20.0}
    assert read_study(json.dumps(one), "a") == read_study(json.dumps([one]), "b") == \
        read_study(json.dumps({"rows": [one]}), "c") == (one,)


@pytest.mark.parametrize("reader,text", [
    (read_status, '{"role": "r"}'), (read_status, "[1, 2]"), (read_faults, '{"time": "x", "kind": 1}'),
    (read_study, '[{"bleu": 1}]'), (read_study, "{"),
])
def test_malformed_files_are_data_errors_naming_the_file(reader: object, text: str) -> None:
    with pytest.raises(DataError, match="the-file"):
        reader(text, "the-file")  # type: ignore[operator]


def test_load_run_reports_unreadable_files_and_keeps_the_rest(tmp_path: Path) -> None:
    (tmp_path / "history").mkdir()
    (tmp_path / "metrics").mkdir()
    (tmp_path / "history" / "a.jsonl").write_text('{"step": 1, "time": 10, "loss": 3}\n')
    (tmp_path / "metrics" / "a.prom").write_text("not prometheus {{")
    (tmp_path / "faults.jsonl").write_text("{broken\n")
    run = load_run(tmp_path)
    assert list(run.workers) == ["a"] and run.workers["a"].history[0]["loss"] == 3.0
    assert run.workers["a"].metrics is None and run.faults == ()
    assert len(run.problems) == 2 and any("metrics/a.prom" in p for p in run.problems)


def test_load_run_refuses_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such run directory"):
        load_run(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match="not a job run directory"):
        load_run(tmp_path)


def test_cli_gives_a_clear_error_for_a_wrong_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["report", str(tmp_path)]) == 1
    assert "not a job run directory" in capsys.readouterr().err


def test_report_of_a_run_with_only_status_files_says_what_is_missing(tmp_path: Path) -> None:
    from nebula_mq.report.render import build_report

    (tmp_path / "status").mkdir()
    (tmp_path / "status" / "w.json").write_text(json.dumps({"worker": "w", "role": "r", "state": "starting"}))
    html = build_report(tmp_path, tmp_path / "out").read_text()
    assert "<img" not in html and "No history/*.jsonl rows" in html and "No faults.jsonl" in html
    assert '<span class="state running">running</span>' in html  # starting counts as running
    assert list((tmp_path / "out" / "figures").iterdir()) == []
    assert "silent" not in html  # no update time known: no staleness claim


def test_a_running_worker_without_recent_status_updates_is_flagged(tmp_path: Path) -> None:
    import time

    from nebula_mq.report.render import build_report

    (tmp_path / "status").mkdir()
    for worker, age in (("fresh", 10.0), ("hung", 3 * 3600.0)):
        (tmp_path / "status" / f"{worker}.json").write_text(json.dumps(
            {"worker": worker, "role": "r", "state": "running", "updated": time.time() - age}))
    html = build_report(tmp_path, tmp_path / "out").read_text()
    assert html.count('class="stale"') == 1 and "silent 3.00 h" in html


# --------------------------------------------------------------------------- derived figures


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.floats(0.01, 50), min_size=1, max_size=200), bins=st.none() | st.integers(1, 50))
def test_step_rate_integrates_back_to_the_number_of_rows(gaps: list[float], bins: int | None) -> None:
    times = 1e9 + np.cumsum([0.0, *gaps])
    rate = derive.step_rate([{"step": i, "time": t} for i, t in enumerate(times)], origin=1e9, bins=bins)
    assert rate is not None
    assert math.isclose(float((rate.rate * rate.bin_s).sum()), len(times), rel_tol=1e-9)
    assert rate.t[0] >= 0 and rate.t[-1] <= times[-1] - 1e9


def test_step_rate_needs_two_distinct_times() -> None:
    assert derive.step_rate([{"step": 1, "time": 5.0}], 0) is None
    assert derive.step_rate([{"step": 1, "time": 5.0}, {"step": 2, "time": 5.0}], 0) is None


def test_flow_compression_counts_each_message_once_from_the_more_complete_side(
        tmp_path: Path, write_metrics: Callable[..., None]) -> None:
    # The sender restarted (its counters cover 4 messages); the receiver saw all 10.
    write_metrics(tmp_path, {"enc": {("act", "out"): 4, ("rep", "in"): 4},
                             "dec": {("act", "in"): 10, ("rep", "out"): 10}})
    by_flow = {f.flow: f for f in derive.flow_compression(load_run(tmp_path).workers.values())}
    assert (by_flow["act"].direction, by_flow["act"].messages) == ("in", 10)
    assert (by_flow["rep"].direction, by_flow["rep"].wire_bytes) == ("out", 250)
    assert by_flow["act"].ratio == 4.0


def test_job_state_is_the_worst_worker_state() -> None:
    from nebula_mq.report.parse import WorkerRun, WorkerStatus

    def w(state: str) -> WorkerRun:
        return WorkerRun(state, WorkerStatus(state, "r", "c", "j", 1, state, 0, 0.0, {}), (), None, ())

    assert derive.job_state([w("finished"), w("finished")]) == "finished"
    assert derive.job_state([w("finished"), w("stopped")]) == "stopped"
    assert derive.job_state([w("stopped"), w("running")]) == "running"
    assert derive.job_state([w("running"), w("failed")]) == "failed"
    assert derive.job_state([]) == "unknown"


def test_units() -> None:
    assert derive.human_bytes(512) == "512 B" and derive.human_bytes(3 * 1024**2) == "3.00 MiB"
    assert derive.human_bits_rate(2.5e6) == "2.5 Mbit/s" and derive.human_bits_rate(12) == "12 bit/s"
    assert derive.human_duration(30) == "30.0 s" and derive.human_duration(900) == "15.0 min"
    smoothed = derive.ema(np.array([np.nan, 1.0, 1.0, 3.0]), span=3)
    assert np.isnan(smoothed[0]) and smoothed[1] == 1.0 and smoothed[3] == 2.0


def test_queue_samples_over_time_become_the_backpressure_plot(tmp_path: Path) -> None:
    """Workers append their queue samples to queues/<worker>.jsonl; the report plots them."""
    from nebula_mq.report.parse import load_run
    from nebula_mq.report.render import build_report

    (tmp_path / "status").mkdir()
    (tmp_path / "status" / "dec-0.json").write_text(json.dumps({"worker": "dec-0", "role": "r", "state": "running"}))
    (tmp_path / "queues").mkdir()
    rows = [{"time": 1000.0 + 10 * i, "queue": "nebula.j.activations", "messages": n} for i, n in enumerate([0, 4, 9, 3])]
    rows[2]["bytes"] = 9 * 2**20  # sampled from the management API
    (tmp_path / "queues" / "dec-0.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"time": 1040.0, "queue"')  # a torn last line
    run = load_run(tmp_path)
    assert [(t, n) for t, _, n, _ in run.queue_depths] == [(1000.0, 0.0), (1010.0, 4.0), (1020.0, 9.0), (1030.0, 3.0)]
    assert [size for _, _, _, size in run.queue_depths][2] == 9 * 2**20
    assert all(np.isnan(size) for i, (_, _, _, size) in enumerate(run.queue_depths) if i != 2)
    html = build_report(tmp_path, tmp_path / "out").read_text()
    assert "Queues and backpressure" in html and (tmp_path / "out" / "figures" / "queues.png").is_file()
