"""``nebula-mq report RUN_DIR|JOB.toml [--out DIR] [--serve [--feed CLUSTER]]``: an offline HTML
report of a job run, or a live one that a browser reloads while the job runs; with ``--feed``,
the live page also lists every worker of every cluster from the job's status feed (as
``nebula-mq status --feed`` does), read from one broker.

``nebula-mq compare BASELINE SYSTEM``: two runs of one job scored against each other: BLEU and
chrF of both runs' evaluations on the same test sentences, with sacrebleu's paired bootstrap
(overall and per domain), and the bytes each run sent per training step.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nebula_mq.atomic import write_json_atomic
from nebula_mq.cli.options import add_stack_option, default_stack
from nebula_mq.errors import ConfigError, NebulaError

if TYPE_CHECKING:
    from nebula_mq.report.feed import FeedWatch


def register(subparsers: Any) -> None:
    from nebula_mq.cli.status import add_feed_options

    parser = subparsers.add_parser(
        "report", help="write an HTML report (curves, throughput, link use, queues, compression, faults) of a run dir")
    parser.add_argument("target", metavar="RUN_DIR|JOB.toml",
                        help="the job's run directory (job.run_dir), or its job file (needed by --feed)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="where to write report.html and figures/ (default: RUN_DIR/report)")
    parser.add_argument("--serve", action="store_true",
                        help="serve the report on http://127.0.0.1:PORT/report.html, rebuilt and reloaded every "
                             "--every seconds while the job runs (Ctrl-C stops)")
    parser.add_argument("--port", type=int, default=8800, help="port of --serve, on loopback only (default 8800)")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between rebuilds with --serve (default 10)")
    add_feed_options(parser, "on the page, beside this host's files; read again every --every seconds")
    add_stack_option(parser, "with --feed: the local stack's directory, whose broker it reads when it runs CLUSTER "
                             "(default $NEBULA_RUN_DIR or run/stack)", default_stack())
    parser.set_defaults(func=_run)

    p = subparsers.add_parser("compare", help="score two runs' evaluations against each other (paired bootstrap)",
                              description="Compare two runs of one job: BLEU and chrF on the same test sentences "
                              "with sacrebleu's paired bootstrap, overall and per domain, and the bytes each sent per "
                              "step. Both runs must have decoded the same sentences (one job, the same eval_samples).")
    p.add_argument("baseline", metavar="BASELINE", help="the baseline's run directory or job file")
    p.add_argument("system", metavar="SYSTEM", help="the compared run's run directory or job file")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--json-out", type=Path, metavar="PATH", default=None, help="also write the JSON to PATH")
    p.set_defaults(func=_compare)


def run_dir_of(target: str) -> Path:
    """A run directory as given, or a job file's ``[job] run_dir``."""
    path = Path(target)
    if not path.is_file():
        return path
    from workers.registry import load_job_settings

    return Path(load_job_settings(str(path)).run_dir)


def _run(args: argparse.Namespace) -> int:
    from nebula_mq.report.render import build_report  # matplotlib only when the command runs

    if args.serve and (not 0 < args.port < 65536 or not args.every > 0):
        raise ConfigError("<command line>", "--port/--every", "a port in 1..65535 and seconds > 0",
                          f"{args.port}/{args.every}")
    run_dir, watch = _target(args)

    def page(refresh_s: float | None = None) -> Path:
        return build_report(run_dir, args.out, refresh_s=refresh_s, feed=None if watch is None else watch.view())

    if not args.serve:
        if watch is not None:  # one reading of the feed, in a page that stays as it is
            watch.poll()
        print(page())
        return 0
    root = page(args.every).parent  # with --feed, "reading the feed": the first read is the feed thread's
    return serve(root, args.port, lambda: page(args.every), args.every, watch)


def _target(args: argparse.Namespace) -> tuple[Path, FeedWatch | None]:
    """The run dir (the argument, or the job file's ``[job] run_dir``) and, with ``--feed``, the
    feed's watch (an unknown cluster is a ConfigError here, before anything is served)."""
    target = Path(args.target)
    if not args.feed:
        return run_dir_of(args.target), None
    if not target.is_file():
        raise ConfigError("<command line>", "RUN_DIR|JOB.toml", "the job file with --feed (it names the "
                          "job whose feed to read)", args.target)
    from workers.registry import load_job_settings

    settings = load_job_settings(str(target))
    from nebula_mq.cli.status import feed_reader
    from nebula_mq.report.feed import FeedWatch

    reader = feed_reader(settings, args.feed, args.stack)
    return settings.run_dir, FeedWatch(args.feed, reader, args.since, args.lost_after,
                                       log=functools.partial(print, flush=True))


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        """No access log on the terminal: the report is the output."""


def serve(root: Path, port: int, rebuild: Callable[[], Any], every: float, feed: FeedWatch | None = None) -> int:
    """Serve ``root`` on loopback and call ``rebuild`` every ``every`` seconds until Ctrl-C; with
    ``feed``, read it in a thread of its own (a slow or failing broker never holds up the rest)
    and rebuild as soon as a read is done."""
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port),
                                                 functools.partial(QuietHandler, directory=str(root)))
    except OSError as exc:
        raise ConfigError("<command line>", "--port", "a free port", f"{port} ({exc.strerror or exc})") from None
    stop, kick = threading.Event(), threading.Event()

    def rebuild_loop() -> None:
        while not stop.is_set():
            kick.wait(every)
            kick.clear()
            if stop.is_set():
                break
            try:
                rebuild()
            except NebulaError as exc:  # a torn file mid-write: the next rebuild reads it whole
                print(f"report: {exc}", flush=True)

    threading.Thread(target=rebuild_loop, daemon=True).start()
    if feed is not None:
        threading.Thread(target=feed.run, args=(stop, every, kick.set), daemon=True).start()
    print(f"serving http://127.0.0.1:{port}/report.html (rebuilt every {every:g} s; Ctrl-C stops)"
          + (f"; status feed: {feed.cluster}'s broker" if feed is not None else ""), flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        kick.set()
        server.server_close()
    return 0


def _compare(args: argparse.Namespace) -> int:
    from nebula_mq.report.compare import compare_runs, render

    if args.bootstrap < 1:
        raise ConfigError("<command line>", "--bootstrap", "a whole number of resamples >= 1", args.bootstrap)
    body = compare_runs(run_dir_of(args.baseline), run_dir_of(args.system), args.bootstrap)
    if args.json_out is not None:
        write_json_atomic(args.json_out, body)
    print(json.dumps(body, indent=2) if args.json else render(body))
    return 0
