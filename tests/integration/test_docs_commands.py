"""Docs that cannot drift: every command block marked runnable in the README and in
examples/README.md runs as written, in order, in a fresh copy of the checkout with a fresh
stack, and must succeed. (The deployment guide's short way needs four hosts: its block is marked
for ``test_four_hosts.py``, which runs it command by command on network namespaces.)

The jobs are cut to a few steps (``NEBULA__JOB__STEPS``) so that the block's every command runs
in seconds; nothing else is changed, the commands' words least of all."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nebula_mq.stack.layout import free_base_port

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"<!-- runnable: tests/integration/test_docs_commands\.py runs this block -->\n```bash\n(.*?)```",
                  re.S)
PAGES = ("README.md", "examples/README.md")


def runnable(page: str) -> list[str]:
    """The commands of ``page``'s marked blocks, in order (a comment after a command kept out)."""
    commands = []
    for block in MARK.findall((ROOT / page).read_text()):
        commands += [line.split("  #")[0].strip() for line in block.splitlines()
                     if line.strip() and not line.lstrip().startswith("#")]
    return commands


def test_every_page_marks_its_blocks_as_this_test_reads_them() -> None:
    counts = {page: len(runnable(page)) for page in PAGES}
    assert counts["README.md"] >= 5 and counts["examples/README.md"] >= 4, counts


def test_the_marked_commands_of_the_readme_and_the_examples_run_as_written(tmp_path: Path) -> None:
    copy = tmp_path / "checkout"
    copy.mkdir()
    for folder in ("config", "examples"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / ".venv").symlink_to(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEBULA")}
    env["NEBULA__JOB__STEPS"] = "6"
    # A fresh stack in the copy's default place, on ports no other stack of this run holds.
    up = subprocess.run([str(copy / ".venv" / "bin" / "nebula-mq"), "stack", "up", "--base-port",
                         str(free_base_port(2, os.getpid() + 7))], cwd=copy, env=env, capture_output=True,
                        text=True, timeout=180)
    assert up.returncode == 0, up.stderr[-2000:]
    try:
        for page in PAGES:
            for command in runnable(page):
                done = subprocess.run(["bash", "-c", command], cwd=copy, env=env, capture_output=True, text=True,
                                      timeout=300)
                assert done.returncode == 0, (f"{page}: `{command}` exited {done.returncode}:\n"
                                              f"{(done.stdout + done.stderr)[-3000:]}")
                assert "Traceback" not in done.stdout + done.stderr, (page, command, done.stderr[-3000:])
    finally:
        subprocess.run([str(copy / ".venv" / "bin" / "nebula-mq"), "stack", "down"], cwd=copy, env=env,
                       capture_output=True, timeout=180)
