"""ELECTRA's processes: the root and sub-discriminators on B, the generator process(es) on A
(or on their own clusters, M3); see ``workers.electra.flows``."""

from __future__ import annotations

from nebula_mq.settings import Settings
from workers.electra.flows import processes
from workers.processes import Plan
from workers.registry import plan_builder

ROLE_MODULES = ("generator", "root", "sub")


@plan_builder("electra")
def plan(settings: Settings) -> Plan:
    return processes(settings)
