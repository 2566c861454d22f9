"""A broken hook does not stop training; an audit log that cannot be written does."""

from __future__ import annotations

from typing import Any

import pytest

from nebula_mq.errors import AuditError
from nebula_mq.runtime.hooks import Hook, Hooks


class Broken(Hook):
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def on_step(self, step: int, values: Any) -> None:
        self.calls += 1
        raise self.error


class Counting(Hook):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_step(self, step: int, values: Any) -> None:
        self.steps.append(step)


def test_a_failing_hook_is_logged_and_the_others_still_run() -> None:
    broken, counting = Broken(RuntimeError("tensorboard went away")), Counting()
    hooks = Hooks([broken, counting])
    hooks.on_step(3, {"loss": 1.0})
    assert broken.calls == 1 and counting.steps == [3]


def test_an_audit_error_reaches_the_worker() -> None:
    hooks = Hooks([Broken(AuditError("/run/audit.log: no space left on device")), Counting()])
    with pytest.raises(AuditError, match="no space left"):
        hooks.on_step(4, {"loss": 1.0})
