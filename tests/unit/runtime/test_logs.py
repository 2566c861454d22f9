"""Logging follows ``sys.stderr`` as it is at write time (nebula_mq.runtime.logs)."""

from __future__ import annotations

import io
import sys

import pytest

from nebula_mq.runtime.logs import configure_logging, get_logger


def test_logs_survive_the_stream_they_were_configured_with_being_closed(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A CLI entry point run in-process configures logging while a test runner has
    swapped ``sys.stderr``; the stand-in is closed afterwards. Every later log call
    used to raise ``ValueError: I/O operation on closed file``."""
    stand_in = io.StringIO()
    real, sys.stderr = sys.stderr, stand_in
    try:
        configure_logging("info", json=True)
        get_logger("t").warning("first", n=1)
    finally:
        sys.stderr = real
    stand_in.close()
    get_logger("t").warning("second", n=2)  # must not raise
    err = capsys.readouterr().err
    assert '"event": "second"' in err and '"event": "first"' not in err
