"""Where a scenario's plan and roles are found: each scenario's subpackage registers its own.

A scenario is the subpackage of ``workers`` named by ``[job] scenario`` (``split``,
``abnet``, ``electra``). Its ``plan`` module says which processes a job runs
(``@plan_builder``; paddle-free, since the launcher reads it) and names its role
modules (``ROLE_MODULES``); each role module registers its entry point with
``@role``. A role or scenario name is registered once: a second function under it
raises at import. Looking a role up imports only that scenario's role modules, in the
worker process that runs it: a process that does not train never imports paddle.
A new scenario is a new subpackage; nothing here changes.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import workers
from nebula_mq.errors import ConfigError, DuplicateRegistration
from nebula_mq.settings import Settings
from workers.processes import Plan

RoleMain = Callable[..., int]  # main(settings[, worker_index]) -> exit code
PlanBuilder = Callable[[Settings], Plan]
F = TypeVar("F", bound=Callable[..., Any])

_ROLES: dict[str, RoleMain] = {}
_PLANS: dict[str, PlanBuilder] = {}


def role(name: str) -> Callable[[F], F]:
    """Register a role's entry point under the name plans and ``--role`` use (once: a second
    function under the same name raises :class:`DuplicateRegistration`)."""
    def register(main: F) -> F:
        _register(_ROLES, "role", name, main)
        return main
    return register


def plan_builder(scenario: str) -> Callable[[F], F]:
    """Register the function that lists a scenario's processes (once per scenario)."""
    def register(build: F) -> F:
        _register(_PLANS, "plan of scenario", scenario, build)
        return build
    return register


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
    """The subpackages of ``workers``: one per scenario."""
    return sorted(m.name for m in pkgutil.iter_modules(workers.__path__) if m.ispkg)


def scenario_plan(settings: Settings) -> ModuleType:
    """The scenario's ``plan`` module (importing it registers the scenario's plan)."""
    name = settings.job.scenario
    if name not in scenarios():
        raise ConfigError(settings.source, "job.scenario", f"one of {scenarios()}", name)
    return importlib.import_module(f"workers.{name}.plan")


def plan_for(settings: Settings) -> Plan:
    """The processes and flows of ``settings``' job."""
    scenario_plan(settings)
    return _PLANS[settings.job.scenario](settings)


def role_main(settings: Settings, name: str) -> RoleMain:
    """The entry point of role ``name`` of this job's scenario (its role modules are imported
    here, in the worker process that runs the role)."""
    plan = scenario_plan(settings)
    package = f"workers.{settings.job.scenario}"
    for module in plan.ROLE_MODULES:
        importlib.import_module(f"{package}.{module}")
    mine = {n: main for n, main in _ROLES.items() if main.__module__.startswith(package + ".")}
    if name not in mine:
        raise ConfigError("<command line>", "--role", f"one of {sorted(mine)}", name)
    return mine[name]
