"""A soak's verdicts (``nebula_mq.chaos.soak.trend``): a leak or a decay fails, noise and jumps do not."""

from __future__ import annotations

import random

import pytest

from nebula_mq.chaos.soak import WARMUP_SHARE, slope, trend

TIMES = [10.0 * i for i in range(60)]  # ten minutes, a sample every 10 s


def test_the_slope_is_the_least_squares_line() -> None:
    assert slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert slope([0, 1, 2], [4, 4, 4]) == 0.0
    assert slope([5.0], [1.0]) == 0.0 and slope([1, 1], [0, 9]) == 0.0


def test_a_steady_rss_with_noise_and_a_restart_dip_passes() -> None:
    rng = random.Random(1)
    rss = [400 + rng.uniform(-15, 15) for _ in TIMES]
    rss[30:33] = [350, 380, 395]  # a restarted worker loads again
    verdict = trend("tail-0 rss_mb", "rss_mb", TIMES, rss)
    assert verdict.ok, verdict
    assert verdict.samples == sum(t >= WARMUP_SHARE * TIMES[-1] for t in TIMES)


def test_a_leak_fails_and_its_rate_per_hour_is_reported() -> None:
    rss = [400 + 0.5 * t for t in TIMES]  # 0.5 MB/s: 1800 MB an hour
    verdict = trend("head-0 rss_mb", "rss_mb", TIMES, rss)
    assert not verdict.ok
    assert verdict.slope_per_h == pytest.approx(1800.0)


def test_startup_growth_is_warm_up_not_a_trend() -> None:
    fds = [20 + min(t, 60.0) for t in TIMES]  # opens 60 descriptors in its first minute, then none
    assert trend("cluster-a fds", "fds", TIMES, fds).ok


def test_descriptors_that_keep_opening_fail_but_a_few_more_do_not() -> None:
    assert not trend("cluster-a fds", "fds", TIMES, [100 + t / 10 for t in TIMES]).ok  # +44 in the window
    assert trend("cluster-a fds", "fds", TIMES, [100 + t / 100 for t in TIMES]).ok  # +4.4


def test_a_decaying_step_rate_fails_a_steady_one_with_stops_passes() -> None:
    decaying = [20.0 * (1 - t / 700) for t in TIMES]
    assert not trend("job steps_per_s", "steps_per_s", TIMES, decaying).ok
    steady = [0.0 if i % 9 == 0 else 20.0 for i in range(len(TIMES))]  # faults stop it now and then
    assert trend("job steps_per_s", "steps_per_s", TIMES, steady).ok
    assert trend("job steps_per_s", "steps_per_s", TIMES, [20.0 + t / 100 for t in TIMES]).ok  # faster is fine


def test_a_fault_near_the_end_of_a_short_soak_is_not_a_decay() -> None:
    """CI's 2.5-minute soak: a worker killed 20 s before the end stops the job for the last few
    samples, which tilts a fitted line by 60% of the mean; the medians stay level."""
    times = [4.0 * i for i in range(38)]
    rate = [26.0 + (i % 3) for i in range(38)]
    rate[33:] = [0.0, 0.0, 3.0, 12.0, 20.0]  # killed at 132 s, importing again, catching up
    assert slope(times[9:], rate[9:]) * (times[-1] - times[9]) < -0.4 * 26  # the line alone would fail it
    assert trend("job steps_per_s", "steps_per_s", times, rate).ok
    rate[20:] = [r / 3 for r in rate[20:]]  # a third of the rate from the middle on: a decay
    assert not trend("job steps_per_s", "steps_per_s", times, rate).ok


def test_any_new_dead_letter_fails_and_queues_may_fill_and_drain() -> None:
    letters = [0.0] * 40 + [1.0] * 20
    assert not trend("cluster-b dead_letters", "dead_letters", TIMES, letters).ok
    queued = [50.0 + (300.0 if i % 10 == 5 else 0.0) for i in range(len(TIMES))]  # cuts fill, heals drain
    assert trend("cluster-b queued", "queued", TIMES, queued).ok
    assert not trend("cluster-b queued", "queued", TIMES, [5.0 * i for i in range(len(TIMES))]).ok
