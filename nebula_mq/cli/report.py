"""``nebula-mq report RUN_DIR [--out DIR] [--serve]``: an offline HTML report of a job run,
or a live one that a browser reloads while the job runs."""

from __future__ import annotations

import argparse
import functools
import http.server
import threading
from pathlib import Path
from typing import Any

from nebula_mq.errors import ConfigError, NebulaError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="write an HTML report (curves, throughput, link use, queues, compression, faults) of a run dir")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the job's run directory (job.run_dir)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="where to write report.html and figures/ (default: RUN_DIR/report)")
    parser.add_argument("--serve", action="store_true",
                        help="serve the report on http://127.0.0.1:PORT/report.html, rebuilt and reloaded every "
                             "--every seconds while the job runs (Ctrl-C stops)")
    parser.add_argument("--port", type=int, default=8800, help="port of --serve, on loopback only (default 8800)")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between rebuilds with --serve (default 10)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from nebula_mq.report.render import build_report  # matplotlib only when the command runs

    if not args.serve:
        print(build_report(args.run_dir, args.out))
        return 0
    if not 0 < args.port < 65536 or not args.every > 0:
        raise ConfigError("<command line>", "--port/--every", "a port in 1..65535 and seconds > 0",
                          f"{args.port}/{args.every}")
    page = build_report(args.run_dir, args.out, refresh_s=args.every)
    return serve(page.parent, args.port, lambda: build_report(args.run_dir, args.out, refresh_s=args.every),
                 args.every)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        """No access log on the terminal: the report is the output."""


def serve(root: Path, port: int, rebuild: Any, every: float) -> int:
    """Serve ``root`` on loopback and call ``rebuild`` every ``every`` seconds until Ctrl-C."""
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port),
                                                 functools.partial(QuietHandler, directory=str(root)))
    except OSError as exc:
        raise ConfigError("<command line>", "--port", "a free port", f"{port} ({exc.strerror or exc})") from None
    stop = threading.Event()

    def rebuild_loop() -> None:
        while not stop.wait(every):
            try:
                rebuild()
            except NebulaError as exc:  # a torn file mid-write: the next rebuild reads it whole
                print(f"report: {exc}")

    threading.Thread(target=rebuild_loop, daemon=True).start()
    print(f"serving http://127.0.0.1:{port}/report.html (rebuilt every {every:g} s; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()
    return 0
