"""A worker the launcher starts prints its one-line error as a JSON object (its log is JSON lines)."""

from __future__ import annotations

import json

import pytest

from nebula_mq.cli import main
from nebula_mq.runtime.logs import JSON_ERRORS_ENV


def test_the_error_is_one_json_line_with_its_type_under_the_launcher(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JSON_ERRORS_ENV, "1")
    assert main(["worker", "--role", "abnet-encoder", "--config", "no/such/job.toml"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["event"] == "error" and record["level"] == "error" and record["error"] == "ConfigError"
    assert "no/such/job.toml" in record["message"] and "\n" not in record["message"]


def test_on_a_terminal_or_elsewhere_it_stays_the_human_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JSON_ERRORS_ENV, raising=False)
    assert main(["worker", "--role", "abnet-encoder", "--config", "no/such/job.toml"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("nebula-mq: error: ") and "no/such/job.toml" in line
