"""Bad input on the command line: one ``nebula-mq: error:`` line echoing the bad value, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nebula_mq.cli import main
from nebula_mq.stack.layout import plan
from tests.fixtures.jobs import ABNET_JOB

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own NEBULA__ variables must not change what these tests see."""
    for name in list(os.environ):
        if name.startswith("NEBULA__"):
            monkeypatch.delenv(name)


@pytest.fixture()
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(ABNET_JOB.format(job_id="cli-errors", seed=7, steps=20, run_dir=tmp_path / "run", batch_size=8,
                                     extra=""))
    return path


@pytest.fixture()
def busy_port() -> Iterator[int]:
    """A port something listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def one_error_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    """Exit 1 and exactly one ``nebula-mq: error:`` line on stderr; returns it."""
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nebula-mq: error: "), err
    return lines[0]


def test_a_directory_as_the_job_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, main(["status", str(tmp_path)]))
    assert f"{tmp_path}: <file>: expected a TOML file, got 'a directory'" in line


def test_a_bad_environment_override_names_the_variable_not_the_file(
    job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEBULA__JOB__STEPS", "abc")
    line = one_error_line(capsys, main(["status", str(job)]))
    assert "environment variable NEBULA__JOB__STEPS: job.steps: expected an integer, got 'abc'" in line
    assert str(job) not in line


def test_a_bad_override_of_a_scenario_section_names_the_variable(
    job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # [abnet] is validated by the role's own schema, after the job file was loaded.
    monkeypatch.setenv("NEBULA__ABNET__IN_FLIGHT", "many")
    line = one_error_line(capsys, main(["worker", "--role", "abnet-encoder", "--config", str(job)]))
    assert "environment variable NEBULA__ABNET__IN_FLIGHT: abnet.in_flight:" in line
    assert "'many'" in line


@pytest.mark.parametrize(("before", "after", "echo"), [
    ("steps = 20", "steps = 0", "job.steps: expected an integer >= 1, got 0"),
    ('id = "cli-errors"', 'id = "Cli Errors"', "job.id: expected a slug matching"),
])
def test_job_checks_echo_the_bad_value(
    job: Path, capsys: pytest.CaptureFixture[str], before: str, after: str, echo: str
) -> None:
    job.write_text(job.read_text().replace(before, after))
    line = one_error_line(capsys, main(["status", str(job)]))
    assert echo in line
    assert after.split(" = ")[1].strip('"') in line


def test_a_worker_without_broker_settings_is_told_how_to_get_them(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_error_line(capsys, main(["worker", "--role", "abnet-encoder", "--config", str(job)]))
    assert "clusters.cluster-a.broker" in line
    assert "the job has none" in line and "--stack DIR" in line and "[clusters.cluster-a.broker]" in line
    assert "named in []" not in line


def test_a_role_the_job_does_not_run_lists_the_ones_it_does(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, main(["worker", "--role", "abnet-encodr", "--config", str(job)]))
    assert "got '--role abnet-encodr --index 0'" in line
    assert "--role abnet-encoder --index 0" in line and "--role abnet-decoder --index 0" in line


def test_a_busy_metrics_port_is_one_line_naming_it(
    job: Path, busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["worker", "--role", "abnet-encoder", "--config", str(job), "--metrics-port", str(busy_port)]
    line = one_error_line(capsys, main(args))
    assert f"--metrics-port: expected a free port ({busy_port} is already in use), got {busy_port}" in line


def test_a_metrics_port_out_of_range_is_a_usage_error(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["worker", "--role", "abnet-encoder", "--config", str(job), "--metrics-port", "99999"])
    assert exit_info.value.code == 2
    assert "expected a port in 1..65535, got 99999" in capsys.readouterr().err


def test_a_misspelt_wan_link_suggests_the_closest_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan(tmp_path, ("cluster-a", "cluster-b")).save()  # a stack's saved layout; no node needed to refuse
    line = one_error_line(capsys, main(["wan", "cut", "--run-dir", str(tmp_path), "--to", "clustr-b"]))
    assert "unknown cluster 'clustr-b'" in line
    assert "has cluster-a, cluster-b (did you mean 'cluster-b'?)" in line


@pytest.mark.parametrize("command", [["status", "{job}"], ["stack", "status", "--run-dir", "{tmp}"]])
def test_output_into_a_closed_pipe_exits_quietly(job: Path, tmp_path: Path, command: list[str]) -> None:
    """`nebula-mq status | head`: the reader is gone before anything is written."""
    if command[0] == "stack":
        plan(tmp_path, ("cluster-a", "cluster-b")).save()  # prints one line per (stopped) node
    else:  # a worker has run, so status prints its table (a job that never ran is an error on stderr)
        (tmp_path / "run" / "status").mkdir(parents=True)
        (tmp_path / "run" / "status" / "enc-0.json").write_text(
            '{"worker": "enc-0", "role": "abnet-encoder", "cluster": "cluster-a", "state": "finished", "step": 1}')
    read_end, write_end = os.pipe()
    os.close(read_end)  # deterministic: every write gets EPIPE
    try:
        args = [a.format(job=job, tmp=tmp_path) for a in command]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-m", "nebula_mq", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60, env=env, cwd=tmp_path)
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 1


def test_certs_list_of_a_missing_directory_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, main(["certs", "list", str(tmp_path / "nope")]))
    assert f"no certificates directory '{tmp_path / 'nope'}'" in line


def test_audit_verify_of_a_missing_log_is_not_reported_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(capsys, main(["audit", "verify", "--log", str(tmp_path / "audit.jsonl")]))
    assert f"no audit log at '{tmp_path / 'audit.jsonl'}'" in line
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("value", ["-5", "0", "soon"])
def test_run_refuses_a_timeout_that_is_not_a_positive_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # Refused while parsing, before the job file is read. (The job file does not exist, so
    # code without the check fails on it instead of starting a stack and workers.)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(tmp_path / "absent.toml"), "--timeout", value, "--stack", str(tmp_path / "stack")])
    assert exit_info.value.code == 2
    assert f"got '{value}'" in capsys.readouterr().err


def test_study_with_an_unknown_row_says_so_on_stderr(tmp_path: Path) -> None:
    # A subprocess: the study installs its own SIGTERM handler.
    proc = subprocess.run([sys.executable, "-m", "nebula_mq", "study", "compression", "--link", "memory",
                           "--run-dir", str(tmp_path), "--only", "FP17+INT8"], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("nebula-mq: error: --only: no such rows ['FP17+INT8']; rows are [")


@pytest.mark.parametrize("argv,expected", [
    (["worker", "--role", "abnet-encoder", "--config", "{job}", "--log-level", "loud"],
     "argument --log-level: invalid choice: 'loud'"),
    (["chaos", "{job}", "--cuts", "abc"], "argument --cuts: expected seconds separated by commas, like 5,10,20; got 'abc'"),
    (["chaos", "{job}", "--cuts", "5,-1"], "argument --cuts: expected positive seconds"),
])
def test_a_mistyped_flag_value_is_a_usage_error_naming_it(
        job: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([a.format(job=job) for a in argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert expected in err.strip().splitlines()[-1], err


def test_showing_an_audit_log_that_is_not_there_is_an_error_not_an_empty_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.jsonl"
    line = one_error_line(capsys, main(["audit", "show", "--log", str(missing)]))
    assert f"no audit log at '{missing}'" in line


def test_a_grant_on_a_mistyped_root_or_dataset_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    audit = ["--audit", str(tmp_path / "audit.jsonl")]
    typo = tmp_path / "dtaa"
    line = one_error_line(capsys, main(["data-access", "grant", str(typo), "alice", "job-1", "bible-es", *audit]))
    assert f"no data root at '{typo}'" in line and not typo.exists()

    root = tmp_path / "data"
    (root / "datasets" / "alice" / "bible-es").mkdir(parents=True)
    line = one_error_line(capsys, main(["data-access", "grant", str(root), "alice", "job-1", "bibel-es", *audit]))
    assert "alice has no dataset 'bibel-es'" in line
    assert not (root / "owners").exists() and not (root / "grants").exists()  # no key, no grant
    assert main(["data-access", "grant", str(root), "alice", "job-1", "bible-es", *audit]) == 0
    assert "granted to job job-1" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "expected"), [
    (["--cluster", "cluster-c"], "--cluster: expected a cluster of the job's workers (cluster-a, cluster-b) "
                                 "(did you mean 'cluster-b'?), got 'cluster-c'"),
    (["--cluster", "cluster-a", "--ranks", "7"], "--ranks: expected ranks of cluster-a's roles ([0]), got '7'"),
])
def test_up_names_a_cluster_or_rank_the_job_does_not_have_before_reading_any_stack(
        job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    code = main(["up", str(job), "--stack", str(tmp_path / "no-stack"), *argv])
    assert expected in one_error_line(capsys, code)
    assert not (tmp_path / "no-stack").exists()
