"""How `nebula-mq run` exits when a signal ends it."""

from __future__ import annotations

import signal

from nebula_mq.launch.supervisor import Outcome, interrupted_exit_code


def test_a_run_ended_by_a_signal_exits_128_plus_the_first_signal() -> None:
    assert interrupted_exit_code([signal.SIGINT]) == 130
    assert interrupted_exit_code([signal.SIGTERM, signal.SIGINT]) == 143
    assert interrupted_exit_code([]) == 130


def test_a_failure_wins_over_a_signal_and_a_clean_run_exits_0() -> None:
    assert Outcome(False, (), ()).exit_code == 0
    assert Outcome(True, (signal.SIGTERM,), ()).exit_code == 143
    assert Outcome(True, (signal.SIGINT,), ("timeout",)).exit_code == 1
    assert Outcome(False, (), ("dec-0",)).exit_code == 1
