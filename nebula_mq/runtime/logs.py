"""structlog setup: JSON lines when not on a terminal, readable output on one.

Every line a worker logs carries ``job``, ``role``, ``step`` and ``micro_batch``:
workers bind them with :func:`bind_context` and the values travel through
``contextvars`` so library code (transport, codecs) inherits them.

Libraries' records (pika's, and Python warnings such as paddle's) go through the
same renderer. A library's exception becomes one ``error`` field (type and
message), not a traceback: a broker outage used to leave about twenty pika
tracebacks in every worker's log. What a worker writes outside structlog (paddle's
glog lines, a crash's traceback) is wrapped into JSON by the launcher's log pipe
(``launch.logpipe``), and a worker the launcher starts prints its one-line error as
JSON too (:data:`JSON_ERRORS_ENV`, :func:`error_record`), so its log is JSON lines only.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

_configured = False
# Set (to "1") by the launcher for the workers it starts: the command line's error is then
# one JSON line (:func:`error_record`) instead of ``nebula-mq: error: ...``.
JSON_ERRORS_ENV = "NEBULA_JSON_ERRORS"


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
    # The stdlib's records (pika, py.warnings) rendered like our own: one line each.
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                           structlog.processors.TimeStamper(fmt="iso", utc=True), _library_error_in_one_line,
                           structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)
    # Re-installed on every call: captureWarnings(True) is a no-op once it has run, even after
    # someone (a test runner's catch_warnings) has put the original showwarning back.
    logging.captureWarnings(False)
    logging.captureWarnings(True)
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
    # A failed connect is logged by these at ERROR, three or four records per attempt, and
    # raised to our transport, which reports it once ("reconnect failed" or the command's error).
    for chatty in ("pika.adapters.utils.connection_workflow", "pika.adapters.blocking_connection",
                   "pika.adapters.utils.io_services_utils", "pika.adapters.base_connection"):
        logging.getLogger(chatty).setLevel(logging.CRITICAL)
    _configured = True


def logging_configured() -> bool:
    """Whether :func:`configure_logging` ran in this process."""
    return _configured


def _library_error_in_one_line(_logger: Any, _method: str, event_dict: MutableMapping[str, Any],
                               ) -> MutableMapping[str, Any]:
    """A library record's exception as ``error: "Type: message"`` instead of a traceback."""
    exc_info = event_dict.pop("exc_info", None)
    if exc_info:
        exc = exc_info[1] if isinstance(exc_info, tuple) else sys.exc_info()[1]
        if exc is not None:
            event_dict["error"] = f"{type(exc).__name__}: {exc}"
    return event_dict


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


def error_record(exc: BaseException) -> str:
    """The error that stops a process as one JSON line, with the fields bound so far (job,
    role...): ``{"event": "error", "error": "ConfigError", "message": ..., "restart_helps":
    false, "level": "error", ...}``; what the supervisor of ``run`` and ``up`` reads back
    (``launch.logpipe.exit_reason``) to say why a worker stopped and whether to start it again."""
    from nebula_mq.errors import NebulaError, one_line

    record = {**structlog.contextvars.get_contextvars(), "event": "error", "error": type(exc).__name__,
              "message": one_line(exc), "restart_helps": exc.restart_helps if isinstance(exc, NebulaError) else True,
              "level": "error", "timestamp": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")}
    return json.dumps(record, sort_keys=True, default=str)
