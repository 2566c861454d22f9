"""``nebula-mq compare BASELINE SYSTEM``: two runs of one job scored against each other.

BLEU and chrF of both runs' evaluations on the same test sentences, with sacrebleu's paired
bootstrap (overall and per domain), and the bytes each run sent per training step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from nebula_mq.atomic import write_json_atomic
from nebula_mq.cli.options import run_dir_of
from nebula_mq.errors import ConfigError

def register(sub: Any) -> None:
    p = sub.add_parser("compare", help="score two runs' evaluations against each other (paired bootstrap)",
                       description="Compare two runs of one job: BLEU and chrF on the same test sentences with "
                       "sacrebleu's paired bootstrap, overall and per domain, and the bytes each sent per step. "
                       "Both runs must have decoded the same sentences (one job, the same eval_samples).")
    p.add_argument("baseline", metavar="BASELINE", help="the baseline's run directory or job file")
    p.add_argument("system", metavar="SYSTEM", help="the compared run's run directory or job file")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--json-out", type=Path, metavar="PATH", default=None, help="also write the JSON to PATH")
    p.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    from nebula_mq.report.compare import compare_runs, render

    if args.bootstrap < 1:
        raise ConfigError("<command line>", "--bootstrap", "a whole number of resamples >= 1", args.bootstrap)
    body = compare_runs(run_dir_of(args.baseline), run_dir_of(args.system), args.bootstrap)
    if args.json_out is not None:
        write_json_atomic(args.json_out, body)
    print(json.dumps(body, indent=2) if args.json else render(body))
    return 0
