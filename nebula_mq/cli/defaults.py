"""Where a command puts what it creates, said when that place is a default.

A command that creates directories (a stack, a job's run directory, the data) and was not told
where uses a path relative to the directory the user stands in. Before it starts, it says so
in one line on stderr, with the absolute path and how to choose another, once: only while the
directory does not exist yet.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TextIO

from nebula_mq.errors import NebulaError

from .options import DEFAULT_STACK

# The commands that create a stack, a job's run directory or the data, by (command, action).
CREATING = {("run", None), ("demo", None), ("up", None), ("chaos", None), ("stack", "up"), ("data", "build")}
DEMO_JOB = "config/demo.toml"


def announce_defaults(args: argparse.Namespace, out: TextIO | None = None) -> list[str]:
    """Print (and return) a line for each default directory ``args``' command will create."""
    command = getattr(args, "command", None)
    action = getattr(args, "stack_cmd", None) or getattr(args, "data_command", None)
    if (command, action) not in CREATING:
        return []
    lines = []
    if command == "data":
        if args.out is None and not os.environ.get("NEBULA_DATA_DIR"):
            lines += _line("the data", Path("run/data"), "--out DIR or $NEBULA_DATA_DIR")
    else:
        job = getattr(args, "job", None) or getattr(args, "config", None) or (DEMO_JOB if command == "demo" else None)
        job_lines = _job_line(job) if job is not None else []
        if job_lines is None:
            return []  # the command fails on its job file, in one line, and creates nothing
        stack = getattr(args, "stack", None)
        if stack in (None, DEFAULT_STACK) and not os.environ.get("NEBULA_RUN_DIR"):
            lines += _line("the local stack", Path(DEFAULT_STACK), "--stack DIR or $NEBULA_RUN_DIR")
        lines += job_lines
    for line in lines:
        print(line, file=out or sys.stderr)
    return lines


def _job_line(job: str) -> list[str] | None:
    """The line for the job's default run directory; None when the job file does not load."""
    from nebula_mq.settings import load_settings

    try:
        settings = load_settings(job)
    except (NebulaError, OSError):
        return None
    if settings.job.run_dir:
        return []
    return _line(f"job {settings.job.id}'s checkpoints, logs and reports", settings.run_dir,
                 "[job] run_dir in the job file")


def _line(what: str, path: Path, how: str) -> list[str]:
    if path.exists():
        return []
    return [f"nebula-mq: {what} will be in {path} ({path.resolve()}), a default under the current "
            f"directory; choose with {how}"]
