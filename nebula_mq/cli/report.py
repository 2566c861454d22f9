"""``nebula-mq report RUN_DIR [--out DIR]``: write an offline HTML report of a job run."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="write an HTML report (curves, throughput, link use, compression, faults) of a run dir")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the job's run directory (job.run_dir)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="where to write report.html and figures/ (default: RUN_DIR/report)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from nebula_mq.report.render import build_report  # matplotlib only when the command runs

    page = build_report(args.run_dir, args.out)
    print(page)
    return 0
