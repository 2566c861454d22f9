"""``configure_cpu``, which every worker calls before its role loads: paddle's math threads where
paddle is installed and the worker computes with it, and no paddle import on a machine without it
(a GPU host with torch only) nor in a worker whose model is PyTorch's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_without_paddle_the_threads_come_back_and_nothing_imports_it() -> None:
    got = _run("""
        import importlib.util, sys
        real = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name == "paddle" else real(name, *a)
        from nebula_mq.models.cpu import configure_cpu
        print(configure_cpu(3), "paddle" in sys.modules)
    """)
    assert got == "3 False"


def test_with_paddle_its_math_threads_are_set() -> None:
    pytest.importorskip("paddle")
    got = _run("""
        import sys
        from nebula_mq.models.cpu import configure_cpu
        print(configure_cpu(2), "paddle" in sys.modules)
    """)
    assert got == "2 True"


def test_a_worker_start_logs_no_ccache_warning_from_paddle() -> None:
    """paddle's import-time "No ccache found" warning (only about compiling custom operators)
    does not open every worker's log; other warnings still show."""
    script = ("import warnings\nfrom nebula_mq.models.cpu import configure_cpu\nconfigure_cpu()\n"
              "warnings.warn('still shown')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ccache" not in out.stderr and "still shown" in out.stderr, out.stderr


# ``workers.plans.run_role`` as ``nebula-mq worker`` calls it, the real role lookup (which imports
# the scenario's role modules) wrapped to note paddle's threads as they load, and the role's loop
# replaced by building the side's model and its framework adapter. Prints whether torch and paddle
# were loaded, the thread settings made before the role modules loaded, and all of them.
_WORKER = """
    import os, sys
    os.environ["NEBULA_THREADS"] = "3"
    import nebula_mq.models.cpu as cpu
    threads = []
    cpu.use_paddle_threads = threads.append
    import workers.plans as plans
    from nebula_mq.models.frameworks import framework_of
    from workers.registry import load_job_settings
    from workers.split.job import load_spec

    def main(settings, worker_index=0):
        if settings.job.scenario == "split":
            framework_of(load_spec(settings, "head").model, "split.head")
        return 0

    real, before = plans.role_main, []
    def role_main(settings, role):
        before.append(list(threads))
        real(settings, role)
        return main

    plans.role_main = role_main
    plans.run_role("{role}", load_job_settings("{job}"))
    print("torch" in sys.modules, "paddle" in sys.modules, before, threads)
"""


def test_a_torch_split_worker_never_loads_paddle() -> None:
    """A PyTorch model's worker, on a machine that has paddle too, loads torch alone."""
    pytest.importorskip("torch")
    pytest.importorskip("paddle")
    got = _run(_WORKER.format(role="split-head", job="examples/split_mlp/job-torch.toml"))
    assert got == "True False [[]] []"


def test_a_paddle_split_worker_gets_its_share_once_its_model_is_known() -> None:
    pytest.importorskip("paddle")
    got = _run(_WORKER.format(role="split-head", job="examples/split_mlp/job.toml"))
    assert got.split(" ", 1)[1] == "True [[]] [3]"


def test_a_paddle_scenario_worker_sets_its_threads_before_its_role_loads() -> None:
    pytest.importorskip("paddle")
    got = _run(_WORKER.format(role="abnet-encoder", job="config/demo.toml"))
    assert got.split(" ", 1)[1] == "True [[3]] [3]"


def test_a_paddle_adapter_leaves_the_threads_of_a_process_that_chose_none() -> None:
    """A user's own process (a notebook calling ``predict``, a test) keeps paddle's threads as
    it set them: only a worker's deferred share is applied."""
    pytest.importorskip("paddle")
    got = _run("""
        import nebula_mq.models.cpu as cpu
        threads = []
        cpu.use_paddle_threads = threads.append
        from nebula_mq.models.frameworks import framework_named
        framework_named("paddle")
        cpu.configure_cpu(2, paddle=False)
        framework_named("paddle")
        framework_named("paddle")
        print(threads)
    """)
    assert got == "[2]"
