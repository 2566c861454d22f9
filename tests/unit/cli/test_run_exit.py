"""How `nebula-mq run` exits when a signal ends it."""

from __future__ import annotations

import signal

from nebula_mq.cli.run import interrupted_exit_code


def test_a_run_ended_by_a_signal_exits_128_plus_the_first_signal() -> None:
    assert interrupted_exit_code([signal.SIGINT]) == 130
    assert interrupted_exit_code([signal.SIGTERM, signal.SIGINT]) == 143
    assert interrupted_exit_code([]) == 130
