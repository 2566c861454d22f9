"""ABNet's processes: the decoder ranks on T, the encoder ranks on S, bound by request/reply flows."""

from __future__ import annotations

from nebula_mq.settings import Settings
from workers.abnet.job import load_job
from workers.processes import Plan
from workers.registry import plan_builder
from workers.split.plan import side_processes

ROLE_MODULES = ("encoder", "decoder")


@plan_builder("abnet")
def plan(settings: Settings) -> Plan:
    return side_processes(load_job(settings), "abnet-encoder", "abnet-decoder")
