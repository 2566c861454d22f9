"""Each scenario's subpackage registers its plan and its roles (workers.registry)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nebula_mq.errors import ConfigError
from nebula_mq.settings import JobSettings, Settings
from workers.registry import role_main, scenarios

ROOT = Path(__file__).resolve().parents[3]


def test_every_scenario_is_a_subpackage_with_a_plan_and_roles() -> None:
    assert scenarios() == ["abnet", "electra", "split"]


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
        role_main(Settings(job=JobSettings(id="reg", scenario="pipline", run_dir=str(tmp_path))), "x")
