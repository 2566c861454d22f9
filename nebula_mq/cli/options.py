"""Options every command spells the same way, and the argparse types of their values.

``--stack DIR`` is the local stack's directory in every command (``run``, ``status``,
``worker``, ``chaos``, ``demo``, ``stack``, ``wan``, ``audit scan-broker``, ``bench``);
``--run-dir``, its older spelling in some of them, is still read.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nebula_mq.security.audit import AuditLog

DEFAULT_STACK = "run/stack"
STACK_HELP = "local stack directory (default $NEBULA_RUN_DIR or run/stack)"
STARTED_STACK_HELP = "local stack directory, started if needed (default $NEBULA_RUN_DIR or run/stack)"
AUDIT_HELP = "audit log (default $NEBULA_AUDIT_LOG or run/audit/audit.jsonl)"
LOG_LEVELS = ("debug", "info", "warning", "error")


def add_stack_option(parser: argparse.ArgumentParser, help_text: str = STACK_HELP,
                     default: str | None = None) -> None:
    """``--stack DIR`` (also read as ``--run-dir``), stored as ``args.stack``."""
    parser.add_argument("--stack", "--run-dir", dest="stack", metavar="DIR", default=default, help=help_text)


def default_stack() -> str:
    return os.environ.get("NEBULA_RUN_DIR", DEFAULT_STACK)


def positive_seconds(text: str) -> float:
    """argparse type of a time limit: a number > 0, echoing a bad value."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not seconds > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return seconds


def seconds_list(text: str) -> tuple[float, ...]:
    """``5,10,20``: positive numbers of seconds (an argparse ``type``: a bad one is a usage error)."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds separated by commas, like 5,10,20; got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive seconds separated by commas, like 5,10,20; got {text!r}")
    return values


def audit_log(path: str | os.PathLike[str] | None) -> AuditLog:
    """The audit log at ``path``, or at the default ($NEBULA_AUDIT_LOG or run/audit/audit.jsonl)."""
    from nebula_mq.security.audit import AuditLog, default_audit_path

    return AuditLog(path or default_audit_path())
