"""The ``nebula-mq`` command line.

Each command module of this package exposes ``register(subparsers) -> None``; the module
adds the parsers of its command or of a few that belong together (``run``, ``demo`` and ``up``)
and sets ``func`` (called with the parsed namespace, returning an exit code).
Modules are discovered, so adding a command never edits this file; its example goes into
:data:`EXAMPLES`. Heavy imports (paddle, pika) happen inside the command functions, so
``nebula-mq --help`` stays fast.

A command that creates directories (a stack, a job's run directory, the data) and was not told
where uses a path relative to the directory the user stands in. Before it starts, it says so
in one line on stderr, with the absolute path and how to choose another, once: only while the
directory does not exist yet (:func:`announce_defaults`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from nebula_mq import __version__
from nebula_mq.errors import ConfigError, NebulaError

from .options import DEFAULT_STACK


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
    add_examples(parser)
    return parser, set(sub.choices)


def _command_modules() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


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


EXAMPLES: dict[str, tuple[str, ...]] = {
    "audit verify": ("nebula-mq audit verify --log run/jobs/demo/audit/audit.jsonl",),
    "audit show": ("nebula-mq audit show --log run/jobs/demo/audit/audit.jsonl --event message_dead_lettered",),
    "audit scan-broker": ("nebula-mq audit scan-broker --stack run/stack",),
    "audit dead-letters": ("nebula-mq audit dead-letters config/demo.toml --log run/jobs/demo/audit/audit.jsonl",),
    "bench codecs": ("nebula-mq bench codecs --quick --json-out run/bench/codecs.json", "nebula-mq bench codecs --peers"),
    "bench transport": ("nebula-mq bench transport --quick", "nebula-mq bench transport --recovery"),
    "bench scenario1": ("nebula-mq bench scenario1 --n 1,2 --delay-ms 20",),
    "bench compute": ("nebula-mq bench compute config/demo.toml",),
    "bench wan": ("nebula-mq bench wan config/demo.toml --steps 120 --rates 10,60 --delay-ms 20,100 --repeats 3",
                  "nebula-mq bench wan config/demo.toml --codecs auto --rates 3 --delay-ms 20,100"),
    "bench scaling": ("nebula-mq bench scaling config/demo.toml --steps 40",),
    "bench replicas": ("nebula-mq bench replicas config/replicas.toml --stack run/stack-3 --rounds 10",),
    "certs init": ("nebula-mq certs init run/certs --clusters cluster-a,cluster-b",),
    "certs issue": ("nebula-mq certs issue run/certs cluster-a demo.enc-0",
                    "nebula-mq certs issue run/certs cluster-a server --hostname broker-a.example.org"),
    "certs request": ("nebula-mq certs request /etc/nebula/certs cluster-b server --hostname broker-b.example.org",),
    "certs sign": ("nebula-mq certs sign run/certs cluster-b request.csr --server --out broker-b.pem",),
    "certs install": ("nebula-mq certs install /etc/nebula/certs cluster-b server broker-b.pem",),
    "certs rotate": ("nebula-mq certs rotate run/certs cluster-b server",),
    "certs revoke": ("nebula-mq certs revoke run/certs cluster-a demo.enc-0",),
    "certs list": ("nebula-mq certs list run/certs",),
    "certs export-ca": ("nebula-mq certs export-ca run/certs cluster-a > cluster-a-ca.pem",),
    "certs export-crl": ("nebula-mq certs export-crl run/certs cluster-a > cluster-a-crl.pem",),
    "certs import-crl": ("nebula-mq certs import-crl run/certs cluster-b cluster-a cluster-a-crl.pem",),
    "certs import-ca": ("nebula-mq certs import-ca run/certs cluster-b cluster-a cluster-a-ca.pem",),
    "chaos": ("nebula-mq chaos config/demo.toml --cuts 5,10,30 --stall 20",),
    "compare": ("nebula-mq compare run/jobs/abnet-corpus-none run/jobs/abnet-corpus-int4",),
    "config show": ("nebula-mq config show config/demo.toml", "NEBULA__JOB__STEPS=50 nebula-mq config show config/demo.toml"),
    "config reference": ("nebula-mq config reference > docs/CONFIG.md",),
    "data build": ("nebula-mq data build",),
    "data stats": ("nebula-mq data stats --json",),
    "data-access grant": ("nebula-mq data-access grant run/data-root alice demo gettext",),
    "data-access revoke": ("nebula-mq data-access revoke run/data-root alice demo gettext",),
    "data-access list": ("nebula-mq data-access list run/data-root alice",),
    "export": ("nebula-mq export examples/split_mlp/job-torch.toml --out run/export/split-mlp-torch",),
    "eval": ("nebula-mq eval config/demo.toml --src my.src --ref my.ref --out run/eval.json",),
    "provision": ("nebula-mq provision job.toml --cluster cluster-a --admin-password-file admin.pw",
                  "nebula-mq provision job.toml --cluster cluster-b --dry-run"),
    "deprovision": ("nebula-mq deprovision job.toml --cluster cluster-a --admin-password-file admin.pw",),
    "probe": ("nebula-mq probe config/electra-tiny.toml --json-out run/probe.json",),
    "report": ("nebula-mq report run/jobs/demo --out run/report",
               "nebula-mq report config/demo.toml --serve --feed cluster-b"),
    "run": ("nebula-mq run config/demo.toml", "nebula-mq run config/demo.toml --metrics-port 9300 --max-restarts 10"),
    "demo": ("nebula-mq demo",),
    "stack up": ("nebula-mq stack up --clusters cluster-a,cluster-b",
                 "nebula-mq stack up --clusters cluster-a --hostname a1.example.org --base-port 5671"),
    "stack trust": ("nebula-mq stack trust cluster-b b1.example.org:5671 --fingerprint sha256:9f86d08...",),
    "stack status": ("nebula-mq stack status",),
    "stack down": ("nebula-mq stack down",),
    "stack restart": ("nebula-mq stack restart cluster-b",),
    "status": ("nebula-mq status config/demo.toml", "nebula-mq status config/demo.toml --json",
               "nebula-mq status job.toml --feed cluster-b --lost-after 30"),
    "up": ("nebula-mq up job.toml --cluster cluster-a", "nebula-mq up job.toml --cluster cluster-a --ranks 0",
           "nebula-mq up job.toml --cluster cluster-a --ranks 1 --broker-host a1.example.org"),
    "study compression": ("nebula-mq study compression --real --rates auto --out run/study-real",),
    "wan shape": ("nebula-mq wan shape --rate-mbit 60 --delay-ms 20",),
    "wan cut": ("nebula-mq wan cut --to cluster-b",),
    "wan drop": ("nebula-mq wan drop cluster-b",),
    "wan heal": ("nebula-mq wan heal",),
    "wan status": ("nebula-mq wan status",),
    "worker": ("nebula-mq worker job.toml --role abnet-encoder --index 0 --stack run/stack",),
}


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The commands one level under ``parser``, by name (argparse keeps them in its actions)."""
    return {name: sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)  # noqa: SLF001
            for name, sub in action.choices.items()}


def verbs(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every leaf command (``"stack up"``) with its parser."""
    commands = _commands(parser)
    if not commands and path:
        yield " ".join(path), parser
    for name, sub in commands.items():
        yield from verbs(sub, (*path, name))


# Under `nebula-mq --help`: where to begin.
START = """start here:
  nebula-mq demo                              set up the local stack and train the flagship job end to end
  nebula-mq run examples/split_mlp/job.toml   your own model split across two clusters (examples/README.md)
  nebula-mq up job.toml --cluster cluster-a   this host's part of a job deployed over several hosts
  nebula-mq COMMAND --help                    each command's options, with examples

The README's quick start: ./dev.sh demo (set up and run the main job), ./dev.sh test (the tests)."""


def _set_examples(parser: argparse.ArgumentParser, lines: tuple[str, ...]) -> None:
    parser.epilog = "example" + ("s" if len(lines) > 1 else "") + ":\n" + "\n".join(f"  {x}" for x in lines)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def add_examples(parser: argparse.ArgumentParser) -> None:
    """Each leaf verb's examples under its help; each group's (``stack``, ``bench``...) one per
    leaf; where to begin under ``nebula-mq --help``."""
    parser.epilog, parser.formatter_class = START, argparse.RawDescriptionHelpFormatter
    groups: dict[str, list[str]] = {}
    for verb, sub in verbs(parser):
        lines = EXAMPLES.get(verb)
        if lines:
            _set_examples(sub, lines)
            if " " in verb:
                groups.setdefault(verb.split(" ")[0], []).append(lines[0])
    for name, group in _commands(parser).items():
        if name in groups:
            _set_examples(group, tuple(groups[name]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
