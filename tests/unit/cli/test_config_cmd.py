"""``nebula-mq config show`` (what a job really runs with) and ``config reference`` (every key,
from the code: docs/CONFIG.md must be its output)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from nebula_mq.cli import main
from nebula_mq.cli.config import reference

ROOT = Path(__file__).resolve().parents[3]


def test_docs_config_md_is_the_reference_the_code_prints() -> None:
    assert (ROOT / "docs" / "CONFIG.md").read_text() == reference(), \
        "regenerate it: nebula-mq config reference > docs/CONFIG.md"


def test_the_reference_documents_every_key_of_every_section() -> None:
    text = reference()
    for key in ("`head_ranks`", "`device`", "`max_decoded_bytes`", "`encrypt_payloads`", "`server_name`",
                "`eval_beam`", "`n_sub`"):
        assert key in text
    assert "|  |" not in text  # every key says what it means
    assert "## `[clusters.<name>.federation]`" in text and "`cert_dir`" in text


def test_every_key_of_a_section_has_its_own_meaning() -> None:
    """A comment above a group of fields used to stand for all of them ("tail_id: Requester id
    of the head worker"): each key now says what it itself is."""
    import re

    meanings: dict[str, dict[str, str]] = {}
    section = ""
    for line in reference().splitlines():
        if line.startswith("## "):
            section = line
        row = re.match(r"\| `(\w+)` \| [^|]+ \| [^|]+ \| (.*) \|$", line)
        if row:
            key, meaning = row.groups()
            other = meanings.setdefault(section, {}).setdefault(meaning, key)
            assert other == key, f"{section}: {other} and {key} share the meaning {meaning!r}"


def test_show_prints_the_file_the_overrides_and_every_default_as_toml(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[job]\nid = "shown"\n[abnet]\nencoder_ranks = 2\nbatch_size = 8\n')
    monkeypatch.setenv("NEBULA__JOB__STEPS", "7")
    assert main(["config", "show", str(job)]) == 0
    text = capsys.readouterr().out
    shown = tomllib.loads(text)
    # Each default and override is marked; what the file says is left plain.
    assert "steps = 7  # NEBULA__JOB__STEPS" in text and 'id = "shown"\n' in text
    assert 'device = "auto"  # default' in text and "head_ranks = 2\n" in text  # (the file's encoder_ranks)
    assert shown["job"]["steps"] == 7 and shown["job"]["run_dir"] == "" and shown["job"]["device"] == "auto"
    assert shown["abnet"]["head_ranks"] == 2 and shown["abnet"]["tail_ranks"] == 1  # the alias, resolved
    assert shown["abnet"]["tail_cluster"] == "cluster-b" and shown["codec"]["backward"] == "int8"
    assert main(["config", "show", str(job), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["transport"]["prefetch"] == 4


def test_show_includes_a_clusters_federation_settings_from_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[job]\nid = "fed"\nscenario = "split"\n'
                   '[clusters.cluster-a.federation]\nhost = "broker-a.example"\nport = 5999\n')
    assert main(["config", "show", str(job)]) == 0
    text = capsys.readouterr().out
    assert '[clusters.cluster-a.federation]\nhost = "broker-a.example"\nport = 5999\n' in text
    assert 'server_name = ""  # default' in text
    assert tomllib.loads(text)["clusters"]["cluster-a"]["federation"]["port"] == 5999


@pytest.mark.parametrize("job", sorted((ROOT / "config").glob("*.toml")) + sorted((ROOT / "examples" / "split_mlp").glob("job*.toml")),
                         ids=lambda p: p.name)
def test_show_reads_every_shipped_job_file_back_as_toml(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", str(job)]) == 0
    shown = tomllib.loads(capsys.readouterr().out)
    assert shown["job"]["id"] == tomllib.loads(job.read_text())["job"]["id"]
    assert shown[shown["job"]["scenario"]]  # the scenario's section, completed with its defaults
