"""Each ABNet preset's learning-rate schedule where the job file sets none (``PRESET_SCHEDULES``):
the pretrained presets warm up and decay, as the measured 60-minute run does, because at a
constant 1e-3 their encoder collapses; what the job file sets wins, key by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from nebula_mq.settings import JobSettings, Settings
from workers.abnet.job import AbnetJob, learning_rate, load_job


def job_with(tmp_path: Path, **abnet: object) -> AbnetJob:
    return load_job(Settings(job=JobSettings(id="sched", scenario="abnet", steps=1000, run_dir=str(tmp_path)),
                             abnet=abnet))


def test_the_tiny_preset_trains_at_a_constant_lr_from_the_first_step(tmp_path: Path) -> None:
    job = job_with(tmp_path)
    assert (job.preset, job.lr, job.warmup_steps, job.lr_decay) == ("tiny", 1e-3, 0, "none")
    assert learning_rate(job, 1000, 0) == learning_rate(job, 1000, 999) == 1e-3


@pytest.mark.parametrize("preset", ["small", "full"])
def test_the_pretrained_presets_warm_up_over_400_steps_then_decay(tmp_path: Path, preset: str) -> None:
    job = job_with(tmp_path, preset=preset)
    assert (job.lr, job.warmup_steps, job.lr_decay) == (1e-3, 400, "cosine")
    assert learning_rate(job, 1000, 0) == pytest.approx(1e-3 / 400)
    assert learning_rate(job, 1000, 399) == pytest.approx(1e-3)
    assert learning_rate(job, 1000, 999) == pytest.approx(1e-3 * job.min_lr_ratio)


def test_what_the_job_file_sets_wins_key_by_key(tmp_path: Path) -> None:
    job = job_with(tmp_path, preset="small", warmup_steps=50, lr=5e-4)
    assert (job.lr, job.warmup_steps, job.lr_decay) == (5e-4, 50, "cosine")
    job = job_with(tmp_path, preset="small", lr_decay="none")
    assert (job.warmup_steps, job.lr_decay) == (400, "none")
