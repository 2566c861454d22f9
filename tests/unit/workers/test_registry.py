"""Each scenario's subpackage registers its plan and its roles (workers.registry)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from dataclasses import dataclass
from typing import Any

import pytest

from nebula_mq.errors import ConfigError, DuplicateRegistration, NebulaError
from nebula_mq.settings import JobSettings, Settings
from workers import registry
from workers.processes import Plan
from workers.registry import (Scenario, declare, load_job_settings, role, role_main, scenario_named, scenario_of,
                              scenarios)

ROOT = Path(__file__).resolve().parents[3]


def test_every_scenario_is_a_subpackage_with_a_plan_and_roles() -> None:
    assert scenarios() == ["abnet", "electra", "replicas", "split"]


def test_plans_come_without_paddle_and_roles_only_from_their_scenario() -> None:
    """The launcher reads plans in a process that never trains: no paddle imported."""
    code = ("import sys\nfrom nebula_mq.settings import load_settings\nfrom workers.plans import plan_for\n"
            "for c in ('config/demo.toml', 'examples/split_mlp/job.toml', 'config/electra-m3.toml'):\n"
            "    print(sorted({p.role for p in plan_for(load_settings(c)).processes}))\n"
            "print('paddle' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout.splitlines()
    assert out == ["['abnet-decoder', 'abnet-encoder']", "['split-head', 'split-tail']",
                   "['electra-generator', 'electra-root', 'electra-sub']", "False"]


@pytest.mark.paddle
def test_a_role_is_looked_up_in_its_jobs_scenario(tmp_path: Path) -> None:
    settings = Settings(job=JobSettings(id="reg", scenario="split", run_dir=str(tmp_path)))
    assert role_main(settings, "split-head").__module__ == "workers.split.head"
    with pytest.raises(ConfigError, match=r"one of \['split-head', 'split-tail'\]"):
        role_main(settings, "abnet-encoder")
    with pytest.raises(ConfigError, match="job.scenario"):
        role_main(Settings(job=JobSettings(id="reg", scenario="pipline",
                                              run_dir=str(tmp_path))), "x")


@pytest.fixture
def fresh_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's registrations go to copies of the tables, dropped after it."""
    monkeypatch.setattr(registry, "_ROLES", dict(registry._ROLES))
    monkeypatch.setattr(registry, "_SCENARIOS", dict(registry._SCENARIOS))


def _twin(func: Callable[..., Any], module: str) -> Callable[..., Any]:
    """A different function object named like ``func``, as if defined in ``module``."""
    def twin(*args: Any) -> int:
        return 0
    twin.__module__, twin.__qualname__ = module, func.__qualname__
    return twin


@pytest.mark.usefixtures("fresh_tables")
def test_a_second_role_under_a_taken_name_is_refused_with_both_names() -> None:
    def first(settings: Settings) -> int:
        return 0

    role("registry-test-role")(first)
    with pytest.raises(DuplicateRegistration, match=r"role 'registry-test-role' is registered twice") as info:
        role("registry-test-role")(_twin(first, "elsewhere"))
    assert isinstance(info.value, NebulaError) and isinstance(info.value, ValueError)
    assert f"{first.__module__}.{first.__qualname__}" in str(info.value) and "elsewhere." in str(info.value)
    assert registry._ROLES["registry-test-role"] is first


@pytest.mark.usefixtures("fresh_tables")
def test_a_second_declaration_of_a_scenario_is_refused() -> None:
    def plan(settings: Settings) -> Any:
        return None

    split = scenario_named("split")
    with pytest.raises(DuplicateRegistration, match=r"scenario 'split' is declared twice: "
                                                    r"by workers\.split\.plan\.plan and by "):
        declare(Scenario("split", split.section, split.load, plan, role_modules=("head",)))
    assert registry._SCENARIOS["split"] is split


def test_one_record_carries_each_scenarios_section_plan_and_roles() -> None:
    from workers.abnet.job import AbnetJob
    from workers.electra.common import ElectraJob
    from workers.replicas.job import ReplicasJob
    from workers.split.job import SplitJob

    records = {name: scenario_named(name) for name in scenarios()}
    assert {n: r.section for n, r in records.items()} == {"abnet": AbnetJob, "electra": ElectraJob,
                                                          "replicas": ReplicasJob, "split": SplitJob}
    assert {n: r.role_modules for n, r in records.items()} == {
        "abnet": ("encoder", "decoder"), "electra": ("generator", "root", "sub"), "replicas": ("replica",),
        "split": ("head", "tail")}
    assert all(r.plan.__module__ == f"workers.{n}.plan" for n, r in records.items())


@pytest.mark.usefixtures("fresh_tables")
def test_the_same_function_registers_again_harmlessly() -> None:
    def main(settings: Settings) -> int:
        return 0

    assert role("registry-test-again")(main) is main
    assert role("registry-test-again")(main) is main  # the module imported twice
    twin = _twin(main, main.__module__)  # the module reloaded: a new object, the same name
    role("registry-test-again")(twin)
    assert registry._ROLES["registry-test-again"] is twin


@pytest.mark.usefixtures("fresh_tables")
def test_reloading_a_scenario_plan_keeps_its_registration() -> None:
    module = importlib.import_module("workers.split.plan")
    importlib.reload(module)
    assert registry._SCENARIOS["split"].plan is module.plan


@dataclass(frozen=True)
class ToySection:
    """The [toy] section of a scenario declared by a test."""

    # How many toys.
    count: int = 1


def _toy_job(settings: Settings) -> ToySection:
    from nebula_mq import config

    return config.build(ToySection, dict(settings.section("toy")), settings.source, "toy.")


def _toy_plan(settings: Settings) -> Plan:
    return Plan((), ())


@pytest.mark.usefixtures("fresh_tables")
def test_a_scenario_declared_anywhere_brings_its_section_into_job_files(tmp_path: Path) -> None:
    """Its declaration is the whole registration: the settings, the loader's checks and the
    config reference take the section from it (the tables are restored after the test)."""
    from nebula_mq.cli.config import reference

    declare(Scenario("toy", ToySection, _toy_job, _toy_plan, role_modules=()))
    job = tmp_path / "toy.toml"
    job.write_text('[job]\nid = "toy"\nscenario = "toy"\n[toy]\ncount = 3\n')
    settings = load_job_settings(job, environ={})
    assert settings.scenario_section() == {"count": 3}
    assert scenario_of(settings).load(settings) == ToySection(3)
    assert "## `[toy]`" in reference() and "| `count` | `int` | `1` | How many toys. |" in reference()
    job.write_text('[job]\nid = "toy"\n[toy]\ncount = 3\n')
    with pytest.raises(ConfigError, match=r'toy: expected \[job\] scenario = "toy" to run a \[toy\] section'):
        load_job_settings(job, environ={})
    job.write_text('[job]\nid = "toy"\nscenario = "toy"\n[toys]\n')
    with pytest.raises(ConfigError) as info:
        load_job_settings(job, environ={})
    assert str(info.value) == (f"{job}: toys: expected one of ['abnet', 'clusters', 'codec', 'electra', 'job', "
                               f"'replicas', 'security', 'split', 'toy', 'transport'], got 'unknown key'")


def test_the_declared_scenarios_are_gone_after_a_test_declared_one() -> None:
    assert "toy" not in scenarios()
