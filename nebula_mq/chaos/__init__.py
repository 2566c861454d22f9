"""Fault injection: a job run under WAN cuts, broker restarts, SIGKILLs and stalls."""

from nebula_mq.chaos.runner import ChaosReport, ChaosRunner, Fault, default_schedule, format_report

__all__ = ["ChaosReport", "ChaosRunner", "Fault", "default_schedule", "format_report"]
