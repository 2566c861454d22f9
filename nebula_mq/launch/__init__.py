"""Start and supervise a job's worker processes on this machine (``run``, ``chaos``, ``demo``)."""

from nebula_mq.launch.processes import JobProcesses

__all__ = ["JobProcesses"]
