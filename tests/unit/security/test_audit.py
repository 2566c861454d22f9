"""The hash-chained audit log: any edit, removal or reordering is detected; appends from many processes chain."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nebula_mq.cli import main
from nebula_mq.errors import AuditError
from nebula_mq.security.audit import GENESIS, AuditLog, record_hash, verify_chain


def _log(path: Path, n: int = 5) -> AuditLog:
    log = AuditLog(path)
    for i in range(n):
        log.record("job_submitted", job=f"j{i}", actor="alice", n=i)
    return log


def test_records_chain_from_genesis(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _log(path, 3)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seq"] for r in recs] == [0, 1, 2]
    assert recs[0]["prev"] == GENESIS
    assert recs[1]["prev"] == recs[0]["hash"] and recs[2]["prev"] == recs[1]["hash"]
    assert all(r["hash"] == record_hash(r) and r["event"] == "job_submitted" and "ts" in r for r in recs)
    report = verify_chain(path)
    assert (report.records, report.head) == (3, recs[2]["hash"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=st.integers(0, 4), field=st.sampled_from(["job", "actor", "n", "ts", "event"]))
def test_any_edited_field_is_detected(tmp_path: Path, line: int, field: str) -> None:
    path = tmp_path / f"edit-{line}-{field}.jsonl"
    path.unlink(missing_ok=True)
    _log(path)
    lines = path.read_text().splitlines()
    rec = json.loads(lines[line])
    rec[field] = "tampered"
    lines[line] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(AuditError, match=f":{line + 1}: hash does not match"):
        verify_chain(path)


def test_edit_with_recomputed_hash_breaks_the_next_link(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _log(path)
    lines = path.read_text().splitlines()
    rec = json.loads(lines[1])
    rec["actor"] = "mallory"
    rec["hash"] = record_hash(rec)  # the forger fixes this line's hash...
    lines[1] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(AuditError, match=":3: prev does not match"):  # ...line 3 still points at the old one
        verify_chain(path)


def test_removed_and_reordered_lines_are_detected(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _log(path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2] + lines[3:]) + "\n")
    with pytest.raises(AuditError, match=":3: seq 3, expected 2"):
        verify_chain(path)
    path.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
    with pytest.raises(AuditError, match=":1: seq 1, expected 0"):
        verify_chain(path)


def test_truncated_tail_needs_the_expected_head(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    _log(path)
    head = verify_chain(path).head
    path.write_text("\n".join(path.read_text().splitlines()[:3]) + "\n")
    assert verify_chain(path).records == 3  # a shorter chain is still a chain...
    with pytest.raises(AuditError, match="truncated"):
        verify_chain(path, expect_head=head)  # ...which the kept head exposes


def test_reserved_fields_and_garbage_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = _log(path, 1)
    with pytest.raises(AuditError, match="reserved"):
        log.record("x", hash="abc")
    with open(path, "a") as fh:
        fh.write("not json\n")
    with pytest.raises(AuditError, match=":2: not JSON"):
        verify_chain(path)
    with pytest.raises(AuditError, match="refusing to append"):
        log.record("after_garbage")


def _append(path: str, who: int) -> None:
    log = AuditLog(path)
    for i in range(25):
        log.record("connection_accepted", user=f"w{who}", i=i)


def test_concurrent_appends_from_processes_stay_one_chain(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append, args=(str(path), k)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    assert verify_chain(path).records == 100
    users = [r["user"] for r in AuditLog(path).records()]
    assert sorted(set(users)) == ["w0", "w1", "w2", "w3"] and all(users.count(f"w{k}") == 25 for k in range(4))


def test_cli_verify_reports_ok_and_the_edited_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "a.jsonl"
    _log(path)
    assert main(["audit", "verify", "--log", str(path)]) == 0
    assert "5 records" in capsys.readouterr().out
    path.write_text(path.read_text().replace('"actor":"alice"', '"actor":"eve"', 1))
    assert main(["audit", "verify", "--log", str(path)]) == 1
    assert "a.jsonl:1: hash does not match" in capsys.readouterr().err
