"""The typed TOML loader: validation errors name file, key and expectation. Job files load as every
command loads them (``workers.registry.load_job_settings``: checked against the declared scenarios)."""

from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from nebula_mq import config
from nebula_mq.errors import ConfigError
from nebula_mq.settings import JobSettings, Settings, load_settings
from workers.registry import load_job_settings

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
[job]
id = "demo-1"
scenario = "abnet"
steps = 20

[clusters.s.broker]
host = "127.0.0.1"
port = 5681
ca_file = "ca.pem"
cert_file = "c.pem"
key_file = "k.pem"

[codec]
forward = "fp16(svd(0.6))"
backward = "int8"
compress_from_step = 5

[abnet]
preset = "tiny"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_good_file_loads_frozen(tmp_path: Path) -> None:
    s = load_job_settings(write(tmp_path, GOOD), environ={})
    assert s.job.id == "demo-1"
    assert s.job.steps == 20
    assert s.clusters["s"].name == "s"
    assert s.clusters["s"].broker.port == 5681
    assert s.codec.compress_from_step == 5
    assert s.scenario_section()["preset"] == "tiny"
    with pytest.raises(FrozenInstanceError):
        s.job.steps = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.section("abnet")["preset"] = "small"  # type: ignore[index]


def test_env_overrides_file(tmp_path: Path) -> None:
    env = {"NEBULA__JOB__STEPS": "7", "NEBULA__CODEC__FORWARD": "int8", "OTHER": "x"}
    s = load_job_settings(write(tmp_path, GOOD), environ=env)
    assert s.job.steps == 7
    assert s.codec.forward == "int8"


@pytest.mark.parametrize(
    ("mutation", "key", "expected"),
    [
        (('steps = 20', 'steps = "many"'), "job.steps", "an integer"),
        (('steps = 20', 'steps = 0'), "job.steps", "an integer >= 1"),
        (('scenario = "abnet"', 'scenario = "gan"'), "job.scenario", "one of"),
        (('port = 5681', 'port = 99999'), "clusters.s.broker.port", "a port in 1..65535"),
        (('compress_from_step = 5', 'compress_from_stepp = 5'), "codec.compress_from_stepp", "one of"),
        (('key_file = "k.pem"', ''), "clusters.s.broker.key_file", "tls = true needs"),
        (('id = "demo-1"', 'id = "Demo 1"'), "job.id", "a slug matching"),
    ],
)
def test_bad_values_name_file_key_and_expectation(
    tmp_path: Path, mutation: tuple[str, str], key: str, expected: str
) -> None:
    path = write(tmp_path, GOOD.replace(*mutation))
    with pytest.raises(ConfigError) as info:
        load_job_settings(path, environ={})
    assert info.value.source == str(path)
    assert info.value.key == key
    assert expected in info.value.expected
    assert str(path) in str(info.value)


def test_missing_required_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_job_settings(write(tmp_path, "[codec]\nforward = 'int8'\n"), environ={})
    assert info.value.key == "job"


def test_syntax_error_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_job_settings(write(tmp_path, "[job\nid="), environ={})
    assert info.value.key == "<syntax>"
    with pytest.raises(ConfigError) as info:
        load_job_settings(tmp_path / "nope.toml", environ={})
    assert "missing" in str(info.value)


def test_field_checks_echo_the_bad_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_job_settings(write(tmp_path, GOOD.replace('id = "demo-1"', 'id = "Demo 1"')), environ={})
    assert info.value.got == "Demo 1"
    assert str(info.value).endswith("got 'Demo 1'")


def test_a_directory_or_unreadable_bytes_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_job_settings(tmp_path, environ={})
    assert (info.value.source, info.value.key, info.value.got) == (str(tmp_path), "<file>", "a directory")
    binary = tmp_path / "job.toml"
    binary.write_bytes(b"\xff\xfe[job]")
    with pytest.raises(ConfigError) as info:
        load_job_settings(binary, environ={})
    assert info.value.key == "<syntax>" and "UTF-8" in info.value.expected


def test_bad_env_override_is_blamed_on_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    with pytest.raises(ConfigError) as info:
        load_job_settings(path, environ={"NEBULA__JOB__STEPS": "abc"})
    assert info.value.key == "job.steps"
    assert info.value.source == "environment variable NEBULA__JOB__STEPS"
    assert str(path) not in str(info.value)
    # A bad value in the file itself is still the file's, with an unrelated override set.
    with pytest.raises(ConfigError) as info:
        load_job_settings(write(tmp_path, GOOD.replace("steps = 20", "steps = 0")), environ={"NEBULA__CODEC__FORWARD": "int8"})
    assert info.value.source == str(path)


def test_an_override_inside_a_table_that_fails_a_table_check_names_file_and_variable() -> None:
    err = config.blame_env(ConfigError("job.toml", "abnet", "in_flight <= train batches"),
                           config.env_overrides({"NEBULA__ABNET__IN_FLIGHT": "64"}))
    assert err.source == "job.toml with NEBULA__ABNET__IN_FLIGHT set"


def test_bad_codec_chain_fails_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_job_settings(write(tmp_path, GOOD.replace('"fp16(svd(0.6))"', '"fp17(svd(0.6))"')), environ={})
    assert info.value.key == "codec.forward"
    assert info.value.got == "fp17(svd(0.6))" and "fp17" in info.value.expected


@pytest.mark.parametrize(("text", "key"), [('source = "x"', "source"), ("[splt]\nhead_ranks = 2", "splt"),
                                           ("[abnet_old]", "abnet_old")])
def test_an_unknown_top_level_key_is_named_with_the_known_ones(tmp_path: Path, text: str, key: str) -> None:
    """``source`` is where the settings came from: set by the loader, never by the file."""
    path = write(tmp_path, f"{text}\n{GOOD}")
    with pytest.raises(ConfigError) as info:
        load_job_settings(path, environ={})
    assert (info.value.source, info.value.key, info.value.got) == (str(path), key, "unknown key")
    assert str(info.value) == (f"{path}: {key}: expected one of ['abnet', 'clusters', 'codec', 'electra', 'job', "
                               f"'replicas', 'security', 'split', 'transport'], got 'unknown key'")


def test_an_unknown_top_level_table_from_the_environment_is_the_variables(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_job_settings(write(tmp_path, GOOD), environ={"NEBULA__SPLT__HEAD_RANKS": "2"})
    assert info.value.key == "splt" and info.value.source.endswith("NEBULA__SPLT__HEAD_RANKS set")


@pytest.mark.parametrize(("scenario", "section", "where"), [
    ("", "split", 'the scenario in force is "abnet", the default'),
    ("", "electra", 'the scenario in force is "abnet", the default'),
    ("electra", "abnet", 'the scenario in force is "electra", set in [job]'),
    ("split", "abnet", 'the scenario in force is "split", set in [job]'),
])
def test_a_section_of_another_scenario_is_refused(tmp_path: Path, scenario: str, section: str,
                                                  where: str) -> None:
    """Without ``[job] scenario`` a job runs ABNet: a lone [split] would silently train the
    tiny synthetic ABNet job instead."""
    job = '[job]\nid = "mixed"\n'
    if scenario:
        job += f'scenario = "{scenario}"\n[{scenario}]\nlr = 0.01\n'
    job += f"[{section}]\nlr = 0.01\n"
    path = write(tmp_path, job)
    with pytest.raises(ConfigError) as info:
        load_job_settings(path, environ={})
    assert info.value.key == section
    assert str(info.value) == (f'{path}: {section}: expected [job] scenario = "{section}" to run a [{section}] '
                               f"section ({where}); set [job] scenario, or remove the section")
    assert "\n" not in str(info.value)


def test_the_scenario_in_force_may_come_from_the_environment(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_job_settings(write(tmp_path, GOOD), environ={"NEBULA__JOB__SCENARIO": "split"})
    assert info.value.key == "abnet"
    assert 'the scenario in force is "split", set by NEBULA__JOB__SCENARIO' in str(info.value)


def test_the_scenarios_own_section_and_none_at_all_load(tmp_path: Path) -> None:
    assert load_job_settings(write(tmp_path, '[job]\nid = "bare"\n'), environ={}).job.scenario == "abnet"
    split = load_job_settings(write(tmp_path, '[job]\nid = "s"\nscenario = "split"\n[split]\nlr = 0.1\n'), environ={})
    assert split.scenario_section() == {"lr": 0.1}


def test_an_undeclared_scenario_is_one_line_listing_the_declared_ones(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace('scenario = "abnet"', 'scenario = "gan"'))
    with pytest.raises(ConfigError) as info:
        load_job_settings(path, environ={})
    assert str(info.value) == f"{path}: job.scenario: expected one of ['abnet', 'electra', 'replicas', 'split'], got 'gan'"
    with pytest.raises(ConfigError) as info:
        load_job_settings(write(tmp_path, '[job]\nid = "x"\n'), environ={"NEBULA__JOB__SCENARIO": "gan"})
    assert str(info.value) == ("environment variable NEBULA__JOB__SCENARIO: job.scenario: expected one of "
                               "['abnet', 'electra', 'replicas', 'split'], got 'gan'")


@pytest.mark.parametrize(("line", "got"), [("abnet = 3", "3"), ("split = 'x'", "'x'")])
def test_a_scenario_section_is_a_table(tmp_path: Path, line: str, got: str) -> None:
    path = write(tmp_path, f'{line}\n[job]\nid = "t"\n')
    with pytest.raises(ConfigError) as info:
        load_job_settings(path, environ={})
    assert str(info.value) == f"{path}: {line.split()[0]}: expected a table, got {got}"


def test_the_settings_layer_keeps_every_other_table_as_a_section(tmp_path: Path) -> None:
    """Below the registry, the loader names no scenario: any other table is a section, kept as
    written; a value that is no table is an unknown key."""
    path = write(tmp_path, '[job]\nid = "raw"\nscenario = "toy"\n[toy]\nx = 1\n[other]\ny = 2\n')
    settings = load_settings(path, environ={})
    assert settings.sections == {"toy": {"x": 1}, "other": {"y": 2}} and settings.scenario_section() == {"x": 1}
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, 'stray = 1\n[job]\nid = "raw"\n'), environ={})
    assert str(info.value).endswith("stray: expected one of ['clusters', 'codec', 'job', 'security', 'transport'] "
                                    "or a scenario's section, got 'unknown key'")


def test_sections_built_in_code_are_named_by_keyword() -> None:
    settings = Settings(job=JobSettings(id="code", scenario="split"), split={"lr": 0.1})
    assert settings.sections == {"split": {"lr": 0.1}} and settings.scenario_section() == {"lr": 0.1}
    assert settings.section("split") == {"lr": 0.1} and settings.section("abnet") == {}
    changed = dataclasses.replace(settings, split={"lr": 0.2}, abnet={"preset": "tiny"})  # type: ignore[call-arg]
    assert changed.sections == {"split": {"lr": 0.2}, "abnet": {"preset": "tiny"}} and changed.job == settings.job
    with pytest.raises(AttributeError, match="split"):
        getattr(settings, "split")  # a section is read by name, typed: settings.section("split")
    with pytest.raises(TypeError):
        settings.sections["abnet"] = {}  # type: ignore[index]


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for d in ("config", "examples")
                                        for p in (ROOT / d).rglob("*.toml")))
def test_every_shipped_job_file_loads(path: str) -> None:
    settings = load_job_settings(ROOT / path, environ={})
    assert settings.scenario_section(), f"{path} has no [{settings.job.scenario}] section"


def test_a_relative_path_in_a_job_file_is_relative_to_that_file_and_an_overrides_to_the_current_dir(
        tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from workers.registry import load_job_settings

    folder = tmp_path / "jobs" / "mine"
    folder.mkdir(parents=True)
    job = folder / "job.toml"
    job.write_text('[job]\nid = "paths"\nscenario = "abnet"\nrun_dir = "../out/paths"\n\n'
                   '[abnet]\ndata_dir = "data"\nencoder_init = "/abs/disc"\n\n'
                   '[clusters.cluster-a.broker]\nca_file = "certs/ca.pem"\ncert_file = "certs/c.pem"\n'
                   'key_file = "/etc/k.pem"\n')
    monkeypatch.chdir(tmp_path)  # wherever the command runs from
    settings = load_job_settings(job, environ={})
    assert settings.run_dir == tmp_path / "jobs" / "out" / "paths"
    assert settings.section("abnet")["data_dir"] == str(folder / "data")
    assert settings.section("abnet")["encoder_init"] == "/abs/disc"  # absolute: as written
    broker = settings.clusters["cluster-a"].broker
    assert (broker.ca_file, broker.cert_file, broker.key_file) == (
        str(folder / "certs" / "ca.pem"), str(folder / "certs" / "c.pem"), "/etc/k.pem")
    # A variable's path is the current directory's, as any path typed at a shell.
    overridden = load_job_settings(job, environ={"NEBULA__JOB__RUN_DIR": "here/runs"})
    assert str(overridden.run_dir) == "here/runs"


def test_the_demo_and_the_examples_run_where_they_did_from_the_top_of_the_checkout() -> None:
    from pathlib import Path

    from workers.registry import load_job_settings

    root = Path(__file__).resolve().parents[2]
    assert load_job_settings(root / "config" / "demo.toml", environ={}).run_dir == root / "run" / "jobs" / "demo"
    job = load_job_settings(root / "examples" / "split_mlp" / "job.toml", environ={})
    assert job.run_dir == root / "run" / "jobs" / "split-mlp"
