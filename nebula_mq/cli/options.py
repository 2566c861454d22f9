"""Options every command spells the same way.

``--stack DIR`` is the local stack's directory in every command (``run``, ``status``,
``worker``, ``chaos``, ``demo``, ``stack``, ``wan``, ``audit scan-broker``, ``bench``);
``--run-dir``, its older spelling in some of them, is still read.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

DEFAULT_STACK = "run/stack"
STACK_HELP = "local stack directory (default $NEBULA_RUN_DIR or run/stack)"


def add_stack_option(parser: argparse.ArgumentParser, help_text: str = STACK_HELP,
                     default: str | None = None) -> None:
    """``--stack DIR`` (also read as ``--run-dir``), stored as ``args.stack``."""
    parser.add_argument("--stack", "--run-dir", dest="stack", metavar="DIR", default=default, help=help_text)


def default_stack() -> str:
    return os.environ.get("NEBULA_RUN_DIR", DEFAULT_STACK)


LOG_LEVELS = ("debug", "info", "warning", "error")


def seconds_list(text: str) -> tuple[float, ...]:
    """``5,10,20``: positive numbers of seconds (an argparse ``type``: a bad one is a usage error)."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds separated by commas, like 5,10,20; got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive seconds separated by commas, like 5,10,20; got {text!r}")
    return values


def run_dir_of(target: str) -> Path:
    """A run directory as given, or a job file's ``[job] run_dir`` (``report``, ``compare``)."""
    path = Path(target)
    if not path.is_file():
        return path
    from workers.registry import load_job_settings

    return Path(load_job_settings(str(path)).run_dir)
