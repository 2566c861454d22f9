"""``nebula-mq config show JOB.toml`` and ``nebula-mq config reference``.

``show`` prints the settings a job really runs with: the file, the ``NEBULA__``
overrides and every default, section by section, each default and override marked. ``reference`` prints every key
with its type, default and meaning, read from the settings dataclasses and the
comments above their fields, so the reference (``docs/CONFIG.md``) cannot drift
from the code: a test compares the two.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import textwrap
from collections.abc import Mapping
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("config", help="show a job's effective settings, or the reference of every key")
    sub = parser.add_subparsers(dest="config_cmd", metavar="CMD", required=True)
    show = sub.add_parser("show", help="the settings JOB.toml runs with (file, NEBULA__ overrides, defaults)")
    show.add_argument("config", help="job TOML file")
    show.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    show.set_defaults(func=_show)
    ref = sub.add_parser("reference", help="every section and key with its type, default and meaning (Markdown)")
    ref.set_defaults(func=_reference)


def sections() -> list[tuple[str, type]]:
    """Each job-file section and the dataclass that reads it."""
    from nebula_mq import settings as s
    from workers.registry import all_scenarios

    return [("job", s.JobSettings), ("codec", s.CodecSettings), ("transport", s.TransportSettings),
            ("security", s.SecuritySettings), ("clusters.<name>.broker", s.BrokerSettings),
            ("clusters.<name>.federation", s.FederationSettings),
            *((sc.name, sc.section) for sc in all_scenarios())]


def effective(settings: Any) -> dict[str, Any]:
    """Section -> key -> value, as the job runs (its scenario's section parsed and completed)."""
    from workers.registry import scenario_of

    out: dict[str, Any] = {name: plain(getattr(settings, name)) for name in ("job", "codec", "transport", "security")}
    for name, cluster in settings.clusters.items():
        out[f"clusters.{name}.broker"] = plain(cluster.broker)
        out[f"clusters.{name}.federation"] = plain(cluster.federation)
    out[settings.job.scenario] = plain(scenario_of(settings).load(settings))
    return out


def plain(value: Any) -> Any:
    """Dataclasses and read-only mappings as dicts, tuples as lists (TOML's and JSON's types)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def origins(path: str, environ: Mapping[str, str] | None = None) -> dict[tuple[str, str], str]:
    """(section, key) -> where its value came from: the job file, or the override variable.
    Keys found in neither are defaults."""
    from nebula_mq.config import env_overrides, load_toml
    from workers.registry import scenario_named, scenarios

    out: dict[tuple[str, str], str] = {}

    def mark(section: str, body: Any) -> None:
        aliases = scenario_named(section).aliases if section in scenarios() else {}
        for key in body if isinstance(body, Mapping) else ():
            name = str(key)
            out[(section, aliases.get(name, name))] = "file"

    for section, body in load_toml(path).items():
        if section == "clusters" and isinstance(body, Mapping):
            for name, cluster in body.items():
                for part in ("broker", "federation"):
                    mark(f"clusters.{name}.{part}", cluster.get(part, {}) if isinstance(cluster, Mapping) else {})
        else:
            mark(section, body)
    for override in env_overrides(environ):
        if len(override.path) >= 2:
            section = ".".join(override.path[:-1]) if override.path[0] == "clusters" else override.path[0]
            out[(section, override.path[-1])] = override.variable
    return out


def toml_text(values: dict[str, Any], marks: Mapping[tuple[str, str], str] | None = None) -> str:
    """``values`` as TOML; with ``marks``, each key says where it came from (``# default``,
    ``# NEBULA__...``; keys from the job file are left plain)."""
    def note(section: str, key: str) -> str:
        if marks is None:
            return ""
        source = marks.get((section, key), "default")
        return "" if source == "file" else f"  # {source}"

    lines: list[str] = []
    for section, body in values.items():
        nested = {k: v for k, v in body.items() if isinstance(v, dict)}
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}{note(section, k)}" for k, v in body.items() if k not in nested]
        for k, v in nested.items():
            lines.append(f"\n[{section}.{k}]{note(section, k)}")
            lines += [f"{kk} = {_toml_value(vv)}" for kk, vv in v.items()]
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def field_docs(cls: type) -> dict[str, tuple[str, str]]:
    """Field name -> (type as written, the comment above it or at its end), over the MRO."""
    out: dict[str, tuple[str, str]] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        source = textwrap.dedent(inspect.getsource(klass))
        lines = source.splitlines()
        previous = ""
        for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                previous = ""
                continue
            comment: list[str] = []
            row = node.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#"):
                comment.insert(0, lines[row].strip().lstrip("#").strip())
                row -= 1
            inline = lines[node.lineno - 1].partition("  # ")[2].strip()
            text = " ".join(comment + ([inline] if inline else []))
            # A field right under a commented one, with no comment of its own, shares it (a group:
            # "# Files of the worker's own identity" over ca_file, cert_file, key_file).
            text = text or (previous if lines[node.lineno - 2].strip() and row == node.lineno - 2 else "")
            out[node.target.id] = (ast.unparse(node.annotation), text or out.get(node.target.id, ("", ""))[1])
            previous = text
    return out


def reference() -> str:
    parts = ["# Job file reference", "",
             "Generated by `nebula-mq config reference` from the settings dataclasses and the comments",
             "above their fields; `nebula-mq config show JOB.toml` prints what one job runs with.",
             "Every key can be overridden from the environment: `NEBULA__SECTION__KEY=value`.",
             "A key of type `path` written in a job file is relative to that job file's folder;",
             "given by a variable, or left at its default, relative to the current directory.", ""]
    for section, cls in sections():
        docs = field_docs(cls)
        doc = cls.__dict__.get("__doc__") or ""
        if doc.startswith(f"{cls.__name__}("):  # the signature dataclasses put where no docstring was
            doc = ""
        summary = inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ") if doc else ""
        parts += [f"## `[{section}]`", "", *([summary, ""] if summary else []),
                  "| key | type | default | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            kind, text = docs.get(f.name, ("", ""))
            if f.default is not dataclasses.MISSING:
                default = _toml_value(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = _toml_value(f.default_factory())
            else:
                default = "(required)"
            kind = "path" if f.metadata.get("path") else kind
            parts.append(f"| `{f.name}` | `{kind}` | `{default}` | {text.replace('|', '/')} |")
        parts.append("")
    return "\n".join(parts).replace("\n\n\n", "\n\n")


def _show(args: argparse.Namespace) -> int:
    from workers.registry import load_job_settings

    values = effective(load_job_settings(args.config))
    if args.json:
        print(json.dumps(values, indent=1, default=str))
    else:
        print(f"# {args.config}: keys marked '# default' are not in the file; '# NEBULA__...' were overridden")
        print(toml_text(values, origins(args.config)), end="")
    return 0


def _reference(args: argparse.Namespace) -> int:
    print(reference(), end="")
    return 0
