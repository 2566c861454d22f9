"""ELECTRA's processes: the root and sub-discriminators on B, the generator process(es) on A
(or on their own clusters, M3); see ``workers.electra.flows``."""

from __future__ import annotations

from nebula_mq.settings import Settings
from workers.electra.common import ElectraJob
from workers.electra.flows import processes
from workers.electra.job import load_job
from workers.processes import Plan
from workers.registry import Scenario, declare


def plan(settings: Settings) -> Plan:
    return processes(settings)


SCENARIO = declare(Scenario("electra", ElectraJob, load_job, plan, role_modules=("generator", "root", "sub")))
