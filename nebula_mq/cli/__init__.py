"""The ``nebula-mq`` command line.

Each command group lives in its own module of this package and exposes
``register(subparsers) -> None``; the module adds its parser(s) and sets
``func`` (called with the parsed namespace, returning an exit code).
Modules are discovered, so adding a command never edits this file.
Heavy imports (paddle, pika) happen inside the command functions, so
``nebula-mq --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from nebula_mq import __version__
from nebula_mq.errors import NebulaError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nebula-mq",
        description="Train deep-learning models across clusters over RabbitMQ.",
    )
    parser.add_argument("--version", action="version", version=f"nebula-mq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if callable(register):
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except NebulaError as exc:
        print(f"nebula-mq: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
