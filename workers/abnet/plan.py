"""ABNet's processes: the decoder ranks on T, the encoder ranks on S, bound by request/reply flows."""

from __future__ import annotations

from nebula_mq.settings import Settings
from workers.abnet.job import DECODER_ROLE, ENCODER_ROLE, PLACEMENT_ALIASES, AbnetJob, load_job
from workers.processes import Plan
from workers.registry import Scenario, declare
from workers.split.plan import side_processes


def plan(settings: Settings) -> Plan:
    return side_processes(load_job(settings), ENCODER_ROLE, DECODER_ROLE)


SCENARIO = declare(Scenario("abnet", AbnetJob, load_job, plan, role_modules=("encoder", "decoder"),
                            aliases=PLACEMENT_ALIASES))
