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


# What `nebula-mq worker` runs up to its role's loop (workers.plans.run_role), the loop replaced by
# building the side's model and its framework adapter; prints the frameworks loaded and each
# setting of paddle's math threads.
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

    plans.role_main = lambda settings, role: main
    plans.run_role("{role}", load_job_settings("{job}"))
    print("torch" in sys.modules, "paddle" in sys.modules, threads)
"""


def test_a_torch_split_worker_never_loads_paddle() -> None:
    """A PyTorch model's worker, on a machine that has paddle too, loads torch alone."""
    pytest.importorskip("torch")
    pytest.importorskip("paddle")
    got = _run(_WORKER.format(role="split-head", job="examples/split_mlp/job-torch.toml"))
    assert got == "True False []"


def test_a_paddle_split_worker_gets_its_thread_share_from_the_adapter() -> None:
    pytest.importorskip("paddle")
    got = _run(_WORKER.format(role="split-head", job="examples/split_mlp/job.toml"))
    assert got.split(" ", 1)[1] == "True [3]"


def test_a_paddle_scenario_worker_sets_its_threads_before_its_role_loads() -> None:
    pytest.importorskip("paddle")
    got = _run(_WORKER.format(role="encoder", job="config/demo.toml"))
    assert got.endswith(" [3]"), got  # set by configure_cpu, before the role's module loads
