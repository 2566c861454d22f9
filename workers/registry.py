"""Where a scenario is declared, once: each scenario's subpackage registers its own.

A scenario is the subpackage of ``workers`` named by ``[job] scenario`` (``split``,
``abnet``, ``electra``). Its ``plan`` module (paddle-free, since the launcher reads it)
declares the whole record in one :func:`declare`: the name, the dataclass that reads the
job file's ``[<name>]`` section and its loader, the function that lists a job's processes,
and the role modules; each role module registers its entry point with ``@role``. The CLI's
config verbs, the launcher, provisioning and ``worker`` read this record, and every command
loads its job file with :func:`load_job_settings`, which checks the file's top-level tables
against the declared scenarios (the settings layer below names none). A role or scenario
name is registered once: a second record under it raises at import. Looking a role up
imports only that scenario's role modules, in the worker process that runs it: a process
that does not train never imports paddle. A new scenario is a new subpackage; nothing here,
in the settings or in the CLI changes.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import workers
from nebula_mq.errors import ConfigError, DuplicateRegistration
from nebula_mq.settings import Settings, load_settings
from workers.processes import Plan

RoleMain = Callable[..., int]  # main(settings[, worker_index]) -> exit code
PlanBuilder = Callable[[Settings], Plan]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Scenario:
    """Everything a scenario is, declared once in its ``plan`` module."""

    name: str
    section: type  # the dataclass that reads the job file's [<name>] section
    load: Callable[[Settings], Any]  # the section of a job's settings, validated and completed
    plan: PlanBuilder  # the processes and flows of a job
    role_modules: tuple[str, ...]  # the modules of workers.<name> that register its roles
    # Other names the section accepts for a key (old name -> key), for `config show`'s marks.
    aliases: Mapping[str, str] = field(default_factory=dict)
    # "paddle": every role computes with paddle; "": each job's model says (paddle or torch),
    # and a worker loads only the framework its model uses.
    framework: str = "paddle"


_ROLES: dict[str, RoleMain] = {}
_SCENARIOS: dict[str, Scenario] = {}


def role(name: str) -> Callable[[F], F]:
    """Register a role's entry point under the name plans and ``--role`` use (once: a second
    function under the same name raises :class:`DuplicateRegistration`)."""
    def register(main: F) -> F:
        _register(_ROLES, "role", name, main)
        return main
    return register


def declare(scenario: Scenario) -> Scenario:
    """Register ``scenario`` (once: a second record under its name, from another plan
    function, raises :class:`DuplicateRegistration`)."""
    held = _SCENARIOS.get(scenario.name)
    if held is not None and _identity(held.plan) != _identity(scenario.plan):
        raise DuplicateRegistration(f"scenario {scenario.name!r} is declared twice: by {_identity(held.plan)} "
                                    f"and by {_identity(scenario.plan)}")
    _SCENARIOS[scenario.name] = scenario
    return scenario


def _register(table: dict[str, Any], kind: str, name: str, func: Callable[..., Any]) -> None:
    """Put ``func`` under ``name``, refusing a different function already there. The same function
    (by module and qualified name: a re-import or a reload of its module) replaces itself."""
    held = table.get(name)
    if held is not None and _identity(held) != _identity(func):
        raise DuplicateRegistration(f"{kind} {name!r} is registered twice: by {_identity(held)} "
                                    f"and by {_identity(func)}")
    table[name] = func


def _identity(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def scenarios() -> list[str]:
    """Every scenario's name: the subpackages of ``workers`` (one per scenario), and any
    scenario declared elsewhere (a test's)."""
    return sorted({m.name for m in pkgutil.iter_modules(workers.__path__) if m.ispkg} | set(_SCENARIOS))


def scenario_named(name: str, source: str = "<settings>") -> Scenario:
    """The record of scenario ``name`` (importing its ``plan`` module declares it)."""
    if name not in _SCENARIOS:
        if name not in scenarios():
            raise ConfigError(source, "job.scenario", f"one of {scenarios()}", name)
        importlib.import_module(f"workers.{name}.plan")
    return _SCENARIOS[name]


def load_job_settings(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of job file ``path`` (``NEBULA__SECTION__KEY`` variables override it), its
    top-level tables checked against the declared scenarios: ``[job] scenario`` names one, and
    every table other than the core ones is that scenario's section. Another scenario's section,
    an unknown scenario or an unknown top-level key is a one-line :class:`ConfigError`, blamed
    on the variable that set it. Every command that runs or reports on a job reads its file here
    (``cli.announce_defaults`` only peeks at ``[job] run_dir``, and leaves the errors to the command)."""
    names = scenarios()
    return load_settings(path, environ, scenarios=names,
                         sections=lambda name: scenario_named(name).section if name in names else None)


def all_scenarios() -> list[Scenario]:
    """Every scenario's record, by name."""
    return [scenario_named(name) for name in scenarios()]


def scenario_of(settings: Settings) -> Scenario:
    """The record of ``settings``' job's scenario."""
    return scenario_named(settings.job.scenario, settings.source)


def plan_for(settings: Settings) -> Plan:
    """The processes and flows of ``settings``' job."""
    return scenario_of(settings).plan(settings)


def role_main(settings: Settings, name: str) -> RoleMain:
    """The entry point of role ``name`` of this job's scenario (its role modules are imported
    here, in the worker process that runs the role)."""
    scenario = scenario_of(settings)
    package = f"workers.{scenario.name}"
    for module in scenario.role_modules:
        importlib.import_module(f"{package}.{module}")
    mine = {n: main for n, main in _ROLES.items() if main.__module__.startswith(package + ".")}
    if name not in mine:
        raise ConfigError("<command line>", "--role", f"one of {sorted(mine)}", name)
    return mine[name]
