"""Data-access interface: owner-signed grants, refusals without a grant, every decision audited."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from nebula_mq.cli import main
from nebula_mq.errors import DataAccessDenied
from nebula_mq.security.audit import AuditLog, verify_chain
from nebula_mq.security.data_access import DataAccess, DataOwner, load_grants


@pytest.fixture
def world(tmp_path: Path) -> tuple[DataOwner, DataAccess, AuditLog]:
    audit = AuditLog(tmp_path / "audit.jsonl")
    alice = DataOwner(tmp_path / "data", "alice", audit)
    (alice.dataset_dir("bible-es") / "part-0.txt").write_text("En el principio")
    return alice, DataAccess(tmp_path / "data", audit), audit


def test_no_grant_no_data_and_the_refusal_is_audited(world: tuple[DataOwner, DataAccess, AuditLog]) -> None:
    _alice, access, audit = world
    with pytest.raises(DataAccessDenied, match="job 'job-b' of tenant 'bob' has no grant from 'alice'"):
        access.open_dataset("job-b", "bob", "alice/bible-es")
    (rec,) = list(audit.records())
    assert rec["event"] == "data_access_denied" and rec["tenant"] == "bob" and rec["dataset"] == "alice/bible-es"


def test_grant_lets_exactly_that_job_read_and_revoke_withdraws(world: tuple[DataOwner, DataAccess, AuditLog]) -> None:
    alice, access, audit = world
    alice.grant("job-b", "bible-es")
    path = access.open_dataset("job-b", "bob", "alice/bible-es")
    assert (path / "part-0.txt").read_text() == "En el principio"
    with pytest.raises(DataAccessDenied):
        access.open_dataset("job-c", "bob", "alice/bible-es")  # another job of the same tenant
    alice.revoke("job-b", "bible-es")
    with pytest.raises(DataAccessDenied):
        access.open_dataset("job-b", "bob", "alice/bible-es")
    events = [r["event"] for r in audit.records()]
    assert events == ["data_grant", "data_access", "data_access_denied", "data_revoke", "data_access_denied"]
    assert verify_chain(audit.path).records == 5


def test_owner_reads_own_data_without_grant(world: tuple[DataOwner, DataAccess, AuditLog]) -> None:
    _alice, access, _audit = world
    assert access.open_dataset("job-a", "alice", "alice/bible-es").name == "bible-es"


def test_grants_file_edited_by_someone_else_grants_nothing(world: tuple[DataOwner, DataAccess, AuditLog]) -> None:
    alice, access, _audit = world
    alice.grant("job-b", "bible-es")
    doc = json.loads(alice.grants_file.read_text())
    doc["payload"]["grants"].append(["job-evil", "bible-es", 1.0])
    alice.grants_file.write_text(json.dumps(doc))
    with pytest.raises(DataAccessDenied, match="signature does not verify"):
        access.open_dataset("job-evil", "eve", "alice/bible-es")
    with pytest.raises(DataAccessDenied, match="signature does not verify"):
        load_grants(alice.root, "alice")  # and the genuine grant is void too until the owner re-signs
    assert stat.S_IMODE(alice.key_file.stat().st_mode) == 0o600


def test_bad_names_and_missing_datasets_are_refused(world: tuple[DataOwner, DataAccess, AuditLog]) -> None:
    _alice, access, _audit = world
    for name in ("alice", "alice/../../etc", "alice/nope"):
        with pytest.raises(DataAccessDenied):
            access.open_dataset("job-a", "alice", name)


def test_cli_grant_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = str(tmp_path / "a.jsonl")
    (tmp_path / "datasets" / "alice" / "bible-es").mkdir(parents=True)  # only a dataset that exists is granted
    assert main(["data-access", "grant", str(tmp_path), "alice", "job-b", "bible-es", "--audit", log]) == 0
    assert main(["data-access", "list", str(tmp_path), "alice"]) == 0
    assert "alice/bible-es -> job job-b" in capsys.readouterr().out
    assert [r["event"] for r in AuditLog(log).records()] == ["data_grant"]
