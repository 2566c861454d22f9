"""Fault injection: a job run under WAN cuts, broker restarts, SIGKILLs and stalls."""

from nebula_mq.chaos.runner import ChaosReport, ChaosRunner, format_report
from nebula_mq.chaos.schedule import Fault, default_schedule

__all__ = ["ChaosReport", "ChaosRunner", "Fault", "default_schedule", "format_report"]
