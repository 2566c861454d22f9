"""A command that creates a directory nobody named says where, once (issue 28: no default
silently creates ./run wherever the user stands)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from nebula_mq.cli import announce_defaults, build_parser, main

JOB = '[job]\nid = "here"\nscenario = "abnet"\n'


def said(argv: list[str]) -> list[str]:
    out = io.StringIO()
    lines = announce_defaults(build_parser().parse_args(argv), out)
    assert out.getvalue().splitlines() == lines
    return lines


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEBULA_RUN_DIR", raising=False)
    monkeypatch.delenv("NEBULA_DATA_DIR", raising=False)
    (tmp_path / "job.toml").write_text(JOB)
    return tmp_path


def test_run_says_where_the_stack_and_the_job_go_until_they_exist(in_tmp: Path) -> None:
    stack, job = said(["run", "job.toml"])
    assert f"run/stack ({in_tmp / 'run' / 'stack'})" in stack and "--stack DIR or $NEBULA_RUN_DIR" in stack
    assert f"run/jobs/here ({in_tmp / 'run' / 'jobs' / 'here'})" in job and "[job] run_dir" in job
    (in_tmp / "run" / "stack").mkdir(parents=True)
    assert said(["up", "job.toml", "--cluster", "cluster-a"]) == [job]
    (in_tmp / "run" / "jobs" / "here").mkdir(parents=True)
    assert said(["run", "job.toml"]) == []


def test_chosen_places_and_commands_that_create_nothing_say_nothing(in_tmp: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (in_tmp / "chosen.toml").write_text(JOB + f'run_dir = "{in_tmp / "jobs"}"\n')
    assert said(["run", "chosen.toml", "--stack", str(in_tmp / "s")]) == []
    assert said(["status", "job.toml"]) == []
    assert said(["stack", "down"]) == []
    assert said(["data", "build", "--out", "d"]) == []
    [data] = said(["data", "build"])
    assert "run/data" in data and "--out DIR or $NEBULA_DATA_DIR" in data
    monkeypatch.setenv("NEBULA_RUN_DIR", str(in_tmp / "s"))
    assert said(["stack", "up"]) == []


def test_a_job_file_the_command_cannot_read_is_left_to_its_own_error(in_tmp: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert said(["run", "missing.toml"]) == []  # not even the default stack: the command fails first
    assert main(["up", "missing.toml", "--cluster", "cluster-a", "--stack", "s"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nebula-mq: error:") and "missing.toml" in err[0], err
