"""What a benchmark says about the machine it ran on."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, else what ``platform.processor`` says."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            return next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        return cpu
