"""``configure_cpu``, which every worker calls before its role loads: paddle's math threads where
paddle is installed, and no paddle import on a machine without it (a GPU host with torch only)."""

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
