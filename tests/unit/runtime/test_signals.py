"""Stop handlers only set a flag; a second SIGINT exits at once (nebula_mq.runtime.signals)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import signal, structlog
from nebula_mq.runtime.logs import configure_logging
from nebula_mq.runtime.signals import StopFlag, install_stop_handlers
configure_logging("info", json=True)
flag = StopFlag()
install_stop_handlers(flag)
"""


def _python(body: str) -> subprocess.CompletedProcess[str]:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_signal_that_interrupts_a_log_call_does_not_deadlock() -> None:
    """The main thread holds structlog's print lock (it is in the middle of a log
    call) when the signal arrives: a handler that logged would wait for ever."""
    done = _python("""
        from structlog._output import _get_lock_for_file
        lock = _get_lock_for_file(structlog.get_config()["logger_factory"]._file)
        with lock:
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)
        print("flag", flag.is_set(), flag.signal_names())
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "flag True ['SIGTERM', 'SIGINT']"


def test_sigint_and_sigterm_together_are_one_stop_request() -> None:
    done = _python("""
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        print("still running", flag.is_set())
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still running True"


def test_a_second_sigint_exits_at_once_with_130_and_says_why() -> None:
    done = _python("""
        signal.raise_signal(signal.SIGINT)
        print("first", flush=True)
        signal.raise_signal(signal.SIGINT)
        print("never printed")
    """)
    assert done.returncode == 130
    assert done.stdout.strip() == "first"
    assert "second interrupt" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.paddle
def test_a_stop_while_paddle_loads_is_held_for_the_workers_handlers() -> None:
    """SIGTERM and SIGINT arrive while the worker starts and paddle loads (it installs C-level
    handlers that end the process with a fatal error): held, they reach the worker's own
    handlers once installed, a stop request like any other."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, signal
        from nebula_mq.runtime.signals import StopFlag, hold_stop_signals, install_stop_handlers
        hold_stop_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        import paddle  # noqa: F401
        flag = StopFlag()
        install_stop_handlers(flag)
        print(flag.is_set(), sorted(flag.signal_names()))
    """)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "True ['SIGINT', 'SIGTERM']", done.stdout
    assert "FatalError" not in done.stderr, done.stderr[-2000:]
