"""structlog setup: JSON lines when not on a terminal, readable output on one.

Every line a worker logs carries ``job``, ``role``, ``step`` and ``micro_batch``:
workers bind them with :func:`bind_context` and the values travel through
``contextvars`` so library code (transport, codecs) inherits them.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

_configured = False


def configure_logging(
    level: str = "info", *, json: bool | None = None, stream: TextIO | None = None
) -> None:
    """Configure structlog once per process. ``json=None`` picks by ``isatty``.

    Without ``stream`` the logs go to whatever ``sys.stderr`` is *at write time*:
    a CLI entry point run in-process (tests, ``capsys``) swaps ``sys.stderr`` and
    closes its stand-in afterwards; a logger bound to that object would raise
    ``ValueError: I/O operation on closed file`` in every later log call.
    """
    global _configured
    out: TextIO = stream or CurrentStderr()  # type: ignore[assignment]
    use_json = (not out.isatty()) if json is None else json
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer(sort_keys=True)
        if use_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # pika logs every connection attempt at INFO; our transport logs what matters.
    logging.getLogger("pika").setLevel(logging.WARNING)
    _configured = True


class CurrentStderr:
    """Whatever ``sys.stderr`` is at write time, as a write-only text stream."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def bind_context(**values: Any) -> None:
    """Bind fields (job, role, step, micro_batch...) to every later log line."""
    structlog.contextvars.bind_contextvars(**values)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
