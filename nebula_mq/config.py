"""Typed, frozen configuration loaded from TOML, with environment overrides.

Any frozen dataclass is a schema: :func:`build` walks its type hints and
validates a plain mapping against them, so every section of a job file (and a
scenario's own section) is checked the same way. A bad value fails with a
:class:`~nebula_mq.errors.ConfigError` that names the file, the dotted key and
what was expected.

**Paths.** A field marked :data:`PATH` names a file or folder. A relative path written in a
job file is relative to the folder of that job file (:func:`resolve_paths`), wherever the
command runs from; a path given by an environment variable, or a field's default, is relative
to the current directory.

Environment variables override file values: ``NEBULA__JOB__STEPS=200`` sets
``[job] steps``. Double underscores separate levels; the value is parsed as a
TOML value when it can be (``true``, ``12``, ``"x"``, ``[1, 2]``) and taken as a
bare string otherwise. A bad overridden value is blamed on its variable, not on
the file (:func:`blame_env`).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import os
import sys
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from nebula_mq.errors import ConfigError

T = TypeVar("T")

ENV_PREFIX = "NEBULA__"
# The metadata of a field that names a file or folder: ``field(default="", metadata=PATH)``.
PATH: Mapping[str, bool] = types.MappingProxyType({"path": True})


def load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML file, translating read and parse errors into :class:`ConfigError`."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(str(p), "<file>", "an existing TOML file", "missing") from None
    except IsADirectoryError:
        raise ConfigError(str(p), "<file>", "a TOML file", "a directory") from None
    except OSError as exc:
        raise ConfigError(str(p), "<file>", "a readable TOML file", exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(p), "<syntax>", "UTF-8 TOML text", f"byte {exc.start}: {exc.reason}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(p), "<syntax>", "valid TOML", str(exc)) from None


class InvalidField(ValueError):
    """Raised by a dataclass's ``validate()`` about one field: :func:`build` then
    reports that field's dotted key and its value (a plain ``ValueError`` names
    only the table)."""

    def __init__(self, field: str, expected: str, got: object) -> None:
        super().__init__(f"{field}: {expected}, got {got!r}")
        self.field = field
        self.expected = expected
        self.got = got


def require(settings: object, field: str, ok: object, expected: str) -> None:
    """One check of a ``validate()``: :class:`InvalidField` about ``field`` of ``settings``
    (with its value) unless ``ok``."""
    if not ok:
        raise InvalidField(field, expected, getattr(settings, field))


@dataclass(frozen=True)
class EnvOverride:
    """One ``NEBULA__A__B=value`` variable and the key path it sets."""

    variable: str
    path: tuple[str, ...]
    raw: str


def env_overrides(environ: Mapping[str, str] | None = None) -> tuple[EnvOverride, ...]:
    """The override variables in ``environ`` (default ``os.environ``), sorted by name."""
    env = os.environ if environ is None else environ
    out = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        path = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__") if part)
        if path:
            out.append(EnvOverride(name, path, env[name]))
    return tuple(out)


def apply_env_overrides(
    data: dict[str, Any], environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Return a deep copy of ``data`` with ``NEBULA__A__B=value`` overrides applied."""
    out = copy.deepcopy(data)
    for override in env_overrides(environ):
        node = out
        for part in override.path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[override.path[-1]] = _parse_env_value(override.raw)
    return out


def blame_env(exc: ConfigError, overrides: Sequence[EnvOverride]) -> ConfigError:
    """``exc`` with its source replaced by the override variable that set the bad key.

    A value set by ``NEBULA__JOB__STEPS`` is the variable's fault, not the file's:
    the user must be sent to the variable. An error about a whole table that an
    override changed names both the file and the variable.
    """
    if "NEBULA__" in exc.source:  # already attributed
        return exc
    key = _key_path(exc.key)
    for override in overrides:
        if key[: len(override.path)] == override.path:  # the variable set this key or a table above it
            return ConfigError(f"environment variable {override.variable}", exc.key, exc.expected, exc.got)
    for override in overrides:
        if key and override.path[: len(key)] == key:  # a check of the table the variable changed
            return ConfigError(f"{exc.source} with {override.variable} set", exc.key, exc.expected, exc.got)
    return exc


def _key_path(key: str) -> tuple[str, ...]:
    """``electra.model.generators[0].lr`` -> ("electra", "model", "generators", "lr")."""
    return tuple(part.split("[", 1)[0].lower() for part in key.split(".") if part and not part.startswith("<"))


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def resolve_paths(cls: type, data: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """``data`` (a table read from a job file in folder ``base``) with each :data:`PATH` field of
    the schema ``cls`` that holds a relative path made relative to ``base``, in nested tables and
    tables of tables too (``[clusters.<name>.broker]``). What the schema does not know is left
    for :func:`build` to refuse."""
    hints = typing.get_type_hints(cls)
    out = dict(data)
    for f in dataclasses.fields(cls):
        value = out.get(f.name)
        if f.metadata.get("path") and isinstance(value, str) and value and not os.path.isabs(value):
            out[f.name] = os.path.normpath(base / value)
        elif isinstance(value, Mapping) and (nested := _table_schema(hints[f.name])) is not None:
            schema, many = nested
            out[f.name] = ({k: resolve_paths(schema, v, base) if isinstance(v, Mapping) else v for k, v in value.items()}
                           if many else resolve_paths(schema, value, base))
    return out


def path_fields(cls: type) -> set[str]:
    """The names of the :data:`PATH` fields of ``cls`` and of the schemas nested in it."""
    hints = typing.get_type_hints(cls)
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        if f.metadata.get("path"):
            out.add(f.name)
        if (nested := _table_schema(hints[f.name])) is not None:
            out |= path_fields(nested[0])
    return out


def _table_schema(tp: Any) -> tuple[type, bool] | None:
    """The schema of a field that is a table (a dataclass: (it, False)) or a table of tables
    (``Mapping[str, <dataclass>]``: (it, True)); None for anything else."""
    args = typing.get_args(tp)
    many = typing.get_origin(tp) in (dict, Mapping) and len(args) == 2
    schema = args[1] if many else tp
    return (schema, many) if dataclasses.is_dataclass(schema) and isinstance(schema, type) else None


def build(cls: type[T], data: Mapping[str, Any], source: str, prefix: str = "") -> T:
    """Validate ``data`` against the frozen dataclass ``cls`` and construct it.

    Unknown keys are errors (a typo must not silently fall back to a default).
    A dataclass may define ``validate(self) -> None`` raising :class:`InvalidField`
    (one field: its key and value are reported) or ``ValueError`` (cross-field
    checks: the message becomes the ``expected`` part of the error).
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(data, Mapping):
        raise ConfigError(source, prefix.rstrip(".") or "<root>", "a table", data)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            source, f"{prefix}{unknown[0]}", f"one of {sorted(fields)}", "unknown key"
        )
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        key = f"{prefix}{name}"
        if name not in data:
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                raise ConfigError(source, key, "a value (required)", "missing")
            continue
        kwargs[name] = _coerce(hints[name], data[name], source, key)
    try:
        obj = cls(**kwargs)
        validate = getattr(obj, "validate", None)
        if callable(validate):
            validate()
    except InvalidField as exc:
        raise ConfigError(source, f"{prefix}{exc.field}", exc.expected, exc.got) from None
    except ValueError as exc:
        raise ConfigError(source, prefix.rstrip(".") or "<root>", str(exc)) from None
    return obj


def _coerce(tp: Any, value: Any, source: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors: list[ConfigError] = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, source, key)
            except ConfigError as exc:
                errors.append(exc)
        raise ConfigError(source, key, " or ".join(e.expected for e in errors), value)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(source, key, f"one of {list(args)}", value)
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return build(tp, value, source, f"{key}.")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(source, key, "an array", value)
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, source, f"{key}[{i}]") for i, v in enumerate(value))
        if origin is tuple and args:
            if len(args) != len(value):
                raise ConfigError(source, key, f"an array of {len(args)} items", value)
            return tuple(_coerce(a, v, source, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        inner = args[0] if args else Any
        items = [_coerce(inner, v, source, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(source, key, "a table", value)
        vt = args[1] if len(args) == 2 else Any
        # Mapping fields of frozen settings are wrapped read-only.
        return types.MappingProxyType(
            {str(k): _coerce(vt, v, source, f"{key}.{k}") for k, v in value.items()}
        )
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, key, "true or false", value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, "an integer", value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(source, key, "a number", value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(source, key, "a string", value)
        return value
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(source, key, f"a {getattr(tp, '__name__', tp)}", value)


def load_function(source: str, key: str, target: str, home: Path | None) -> Callable[..., Any]:
    """The function a job file names as ``"package.module:function"`` at ``key``, imported; its
    module is looked for in ``home`` too (the user's modules sit next to their job file). A name
    that is not one, or not importable, or not callable is a one-line ConfigError."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(source, key, "'package.module:function'", target or "<empty>")
    if home is not None and str(home) not in sys.path:
        sys.path.append(str(home))
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(source, key, "an importable 'module:function'", f"{target} ({exc})") from None
    if not callable(function):
        raise ConfigError(source, key, "a callable", target)
    return function
