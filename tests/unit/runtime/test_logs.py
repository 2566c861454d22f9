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


def test_library_records_and_warnings_are_json_lines_without_tracebacks() -> None:
    """pika's records and Python warnings (paddle's) are rendered like our own lines."""
    import json
    import logging
    import warnings

    out = io.StringIO()
    configure_logging("info", json=True, stream=out)
    try:
        raise ConnectionResetError("connection lost")
    except ConnectionResetError:
        logging.getLogger("pika.adapters.select_connection").error("socket error", exc_info=True)
    logging.getLogger("pika.connection").info("connecting")  # below WARNING: dropped
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a library is unhappy", UserWarning, stacklevel=1)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]  # every line is JSON
    assert "Traceback" not in out.getvalue()
    pika = next(r for r in lines if r["event"] == "socket error")
    assert pika["error"] == "ConnectionResetError: connection lost" and pika["level"] == "error"
    assert pika["logger"].startswith("pika")
    assert any("a library is unhappy" in r["event"] and r["logger"] == "py.warnings" for r in lines)
    assert not any(r["event"] == "connecting" for r in lines)
