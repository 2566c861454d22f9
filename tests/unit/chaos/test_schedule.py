"""The chaos run's default schedule: every kind of fault spread over the first 70% of the job,
a certificate rotation only when asked (``nebula-mq chaos --rotate``)."""

from __future__ import annotations

import pytest

from nebula_mq.chaos import default_schedule
from nebula_mq.cli import build_parser
from nebula_mq.errors import ConfigError

CLUSTERS = ("cluster-a", "cluster-b")
WORKERS = ("tail-0", "head-0")


@pytest.mark.parametrize("rotate", [False, True])
def test_every_fault_once_in_order_and_a_rotation_when_asked(rotate: bool) -> None:
    schedule = default_schedule(100, CLUSTERS, WORKERS, cut_s=(1, 2, 3, 4, 5), stall_s=7, rotate=rotate)
    got = [(f.kind, f.target) for f in schedule]
    expected = [("cut", ""), ("cut", ""), ("kill", "tail-0"), ("cut", ""), ("restart", "cluster-b"), ("cut", ""),
                ("kill", "head-0"), ("cut", ""), ("stall", "head-0")] + ([("rotate", "tail-0")] if rotate else [])
    assert got == expected
    steps = [f.at_step for f in schedule]
    assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] <= 70


def test_the_cli_flag_reaches_the_schedule() -> None:
    args = build_parser().parse_args(["chaos", "job.toml", "--rotate"])
    assert args.rotate is True
    assert build_parser().parse_args(["chaos", "job.toml"]).rotate is False


def test_too_short_a_job_is_one_error() -> None:
    with pytest.raises(ConfigError, match="at least 20 steps"):
        default_schedule(10, CLUSTERS, WORKERS)
