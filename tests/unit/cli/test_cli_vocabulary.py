"""The CLI speaks one vocabulary: every option and argument explains itself, and the local
stack's directory is ``--stack`` in every command that takes it."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from nebula_mq.cli import build_parser


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("nebula-mq",),
             ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield " ".join(path), parser
    for action in parser._actions:  # noqa: SLF001 - argparse exposes its tree only this way
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def test_every_option_and_positional_argument_has_help() -> None:
    missing = [f"{path} {'/'.join(a.option_strings) or a.dest}"
               for path, parser in commands(build_parser()) for a in parser._actions  # noqa: SLF001
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help]  # noqa: SLF001
    assert missing == []


def test_the_stack_directory_is_stack_everywhere_and_run_dir_still_reads() -> None:
    takes_stack = {path: parser for path, parser in commands(build_parser())
                   if any("--stack" in a.option_strings for a in parser._actions)}  # noqa: SLF001
    run_dirs = {a.dest for _, parser in commands(build_parser()) for a in parser._actions  # noqa: SLF001
                if "--run-dir" in a.option_strings}
    assert run_dirs == {"stack", "out"}  # an older spelling of --stack, or of study's --out
    assert {"nebula-mq run", "nebula-mq status", "nebula-mq worker", "nebula-mq chaos", "nebula-mq stack up",
            "nebula-mq wan cut", "nebula-mq audit scan-broker", "nebula-mq bench scaling"} <= set(takes_stack)
    for path, parser in takes_stack.items():
        option = next(a for a in parser._actions if "--stack" in a.option_strings)  # noqa: SLF001
        assert option.dest == "stack" and "--run-dir" in option.option_strings, path
    args = build_parser().parse_args(["wan", "cut", "--run-dir", "/x"])
    assert args.stack == "/x"
    assert build_parser().parse_args(["study", "compression", "--out", "/r"]).out == "/r"


def test_every_verb_has_an_example_that_its_own_parser_accepts() -> None:
    import shlex

    from nebula_mq.cli import EXAMPLES, verbs

    parser = build_parser()
    names = {verb for verb, _ in verbs(parser)}
    assert names == set(EXAMPLES), (names ^ set(EXAMPLES))
    for verb, sub in verbs(parser):
        assert sub.epilog and all(line in sub.epilog for line in EXAMPLES[verb])
        for line in EXAMPLES[verb]:
            words = [w for w in shlex.split(line) if "=" not in w or w.startswith("-")]
            words = words[: words.index(">")] if ">" in words else words
            assert words[0] == "nebula-mq" and " ".join(words[1:]).startswith(verb), line
            build_parser().parse_args(words[1:])  # argparse exits on a bad example


def test_the_top_level_help_says_where_to_begin_and_each_group_shows_examples() -> None:
    import argparse

    parser = build_parser()
    top = parser.format_help()
    assert "nebula-mq demo" in top and "./dev.sh demo" in top and "nebula-mq up job.toml" in top
    groups = [sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
              for sub in action.choices.values()
              if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)]
    assert len(groups) >= 6  # audit, bench, certs, config, data, data-access, stack, study, wan
    for group in groups:
        assert group.epilog and group.epilog.startswith("example") and f"nebula-mq {group.prog.split()[-1]} " in group.epilog, group.prog


def test_a_command_imports_its_own_module_alone_and_the_rest_get_the_whole_parser() -> None:
    """A worker's start (and its restarts) builds the ``worker`` parser only: no benchmark or
    stack module is imported for it. Top-level help and a mistyped command see every command."""
    import subprocess
    import sys

    script = """
import sys
from nebula_mq.cli import _parser_for
args = _parser_for(["worker", "job.toml", "--role", "split-head"]).parse_args(
    ["worker", "job.toml", "--role", "split-head"])
assert args.command == "worker" and args.job == "job.toml", args
print(" ".join(m for m in sys.modules if m.startswith(("nebula_mq.bench", "nebula_mq.stack", "nebula_mq.cli."))))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(out.stdout.split())
    assert "nebula_mq.cli.worker" in loaded
    assert not loaded & {"nebula_mq.bench", "nebula_mq.stack", "nebula_mq.cli.bench", "nebula_mq.cli.stack"}, loaded
    from nebula_mq.cli import _parser_for

    every = {name for _path, parser in commands(build_parser()) for name in [parser.prog]}
    for typed in (["--help"], ["bogus"], ["demo"], ["deprovision", "job.toml"]):
        assert {p.prog for _path, p in commands(_parser_for(typed))} == every, typed
