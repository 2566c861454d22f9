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
import os
import pkgutil
import sys
from collections.abc import Sequence

from nebula_mq import __version__
from nebula_mq.errors import ConfigError, NebulaError

from .defaults import announce_defaults


def build_parser() -> argparse.ArgumentParser:
    return _build(_command_modules())[0]


def _build(modules: Sequence[str]) -> tuple[argparse.ArgumentParser, set[str]]:
    """The parser with the commands that ``modules`` register, and those commands' names."""
    parser = argparse.ArgumentParser(
        prog="nebula-mq",
        description="Train deep-learning models across clusters over RabbitMQ.",
    )
    parser.add_argument("--version", action="version", version=f"nebula-mq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in modules:
        module = importlib.import_module(f"{__name__}.{name}")
        register = getattr(module, "register", None)
        if callable(register):
            register(sub)
    from nebula_mq.cli.examples import add_examples

    add_examples(parser)
    return parser, set(sub.choices)


def _command_modules() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(__path__)
                  if not info.name.startswith("_") and info.name not in ("options", "examples"))


def _parser_for(argv: Sequence[str] | None) -> argparse.ArgumentParser:
    """The parser of the command typed, built from its own module alone where a module of that
    name registers it: every worker start and restart runs through here, and importing all the
    command modules (the benchmarks', the stack's) cost each one 0.6 s of CPU. The whole parser
    otherwise: top-level help, a mistyped command, a command another module registers."""
    args = sys.argv[1:] if argv is None else list(argv)
    typed = args[0] if args else ""
    modules = _command_modules()
    if typed.replace("-", "_") in modules:
        parser, commands = _build([typed.replace("-", "_")])
        if typed in commands:
            return parser
    return _build(modules)[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a user's mistake ends as one ``nebula-mq: error:`` line and exit 1
    (argparse's own usage errors exit 2), never a traceback."""
    try:
        parser = _parser_for(argv)
        args = parser.parse_args(argv)
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            code = 2
        else:
            announce_defaults(args)
            code = int(func(args) or 0)
        # Output to a pipe is buffered: a reader that went away shows up here, not at exit.
        sys.stdout.flush()
        return code
    except ConfigError as exc:
        # Scenario sections are validated after loading (by their roles): a bad value an
        # environment override put there is still the variable's fault.
        from nebula_mq.config import blame_env, env_overrides

        return _error(blame_env(exc, env_overrides()))
    except NebulaError as exc:
        return _error(exc)
    except BrokenPipeError:
        # `nebula-mq status | head`: the reader is gone. As the Python docs advise, point
        # stdout at devnull so the interpreter's final flush cannot fail again, and exit quietly.
        _silence_stdout()
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # Not one of ours: a bug, or a library's error nobody translated. A worker the
        # launcher started still ends with its error record (the traceback above it, in its
        # log) so that `run` and `up` can say why it stopped; anywhere else, the traceback.
        if not _launched():
            raise
        import traceback

        traceback.print_exc()
        return _error(exc)


def _error(exc: BaseException) -> int:
    """One line on stderr: ``nebula-mq: error: ...`` (a message quoting a tool's multi-line
    output joined), or, for a worker the launcher started, a JSON record with the error's
    type in its JSON-lines log (``runtime.logs.error_record``)."""
    from nebula_mq.errors import one_line
    from nebula_mq.runtime.logs import error_record

    if _launched():
        print(error_record(exc), file=sys.stderr)
    else:
        print(f"nebula-mq: error: {one_line(exc)}", file=sys.stderr)
    return 1


def _launched() -> bool:
    """Whether the launcher started this process (its stderr goes into a JSON-lines log)."""
    from nebula_mq.runtime.logs import JSON_ERRORS_ENV

    return os.environ.get(JSON_ERRORS_ENV) == "1"


def _silence_stdout() -> None:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture): nothing will flush to a closed pipe
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
