"""The typed TOML loader: validation errors name file, key and expectation."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from nebula_mq.errors import ConfigError
from nebula_mq.settings import load_settings

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
    s = load_settings(write(tmp_path, GOOD), environ={})
    assert s.job.id == "demo-1"
    assert s.job.steps == 20
    assert s.clusters["s"].name == "s"
    assert s.clusters["s"].broker.port == 5681
    assert s.codec.compress_from_step == 5
    assert s.scenario_section()["preset"] == "tiny"
    with pytest.raises(FrozenInstanceError):
        s.job.steps = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.abnet["preset"] = "small"  # type: ignore[index]


def test_env_overrides_file(tmp_path: Path) -> None:
    env = {"NEBULA__JOB__STEPS": "7", "NEBULA__CODEC__FORWARD": "int8", "OTHER": "x"}
    s = load_settings(write(tmp_path, GOOD), environ=env)
    assert s.job.steps == 7
    assert s.codec.forward == "int8"


@pytest.mark.parametrize(
    ("mutation", "key", "expected"),
    [
        (('steps = 20', 'steps = "many"'), "job.steps", "an integer"),
        (('steps = 20', 'steps = 0'), "job", "steps >= 1"),
        (('scenario = "abnet"', 'scenario = "gan"'), "job.scenario", "one of"),
        (('port = 5681', 'port = 99999'), "clusters.s.broker", "port in 1..65535"),
        (('compress_from_step = 5', 'compress_from_stepp = 5'), "codec.compress_from_stepp", "one of"),
        (('key_file = "k.pem"', ''), "clusters.s.broker", "key_file"),
        (('id = "demo-1"', 'id = "Demo 1"'), "job", "id matching"),
    ],
)
def test_bad_values_name_file_key_and_expectation(
    tmp_path: Path, mutation: tuple[str, str], key: str, expected: str
) -> None:
    path = write(tmp_path, GOOD.replace(*mutation))
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert info.value.source == str(path)
    assert info.value.key == key
    assert expected in info.value.expected
    assert str(path) in str(info.value)


def test_missing_required_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, "[codec]\nforward = 'int8'\n"), environ={})
    assert info.value.key == "job"


def test_syntax_error_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, "[job\nid="), environ={})
    assert info.value.key == "<syntax>"
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path / "nope.toml", environ={})
    assert "missing" in str(info.value)


def test_bad_env_override_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, GOOD), environ={"NEBULA__JOB__STEPS": "abc"})
    assert info.value.key == "job.steps"


def test_bad_codec_chain_fails_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, GOOD.replace('"fp16(svd(0.6))"', '"fp17(svd(0.6))"')), environ={})
    assert info.value.key == "codec"
    assert "forward" in info.value.expected and "fp17" in info.value.expected
