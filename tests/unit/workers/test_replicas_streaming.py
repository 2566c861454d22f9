"""Streaming DiLoCo in the replicas job: fragments synced in turn, inner steps overlapping the
wire (workers/replicas/schedule.py), over the in-memory transport; the schedule on its own;
the job against a direct implementation of the update."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nebula_mq.errors import ConfigError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.hooks import Hook
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.replicas import (THREE, Builder, StopAfterSending, crashing, hooks_of, run, run_one_interrupted,
                                     settings_for)
from tests.fixtures.threads import StopAt, history
from workers.replicas.job import load_job
from workers.replicas.schedule import SyncSchedule, partition

pytestmark = pytest.mark.paddle

STREAMING = {"inner_steps": 4, "fragments": 2, "overlap_steps": 1}


def test_one_fragment_without_overlap_is_dilocos_rounds() -> None:
    s = SyncSchedule(inner_steps=5, fragments=1, overlap=0, events=3)
    assert s.events == 3 and s.inner_total == 15
    assert [(s.fragment(e), s.outer_round(e), s.send_at(e), s.apply_at(e)) for e in range(3)] == [
        (0, 0, 5, 5), (0, 1, 10, 10), (0, 2, 15, 15)]
    assert s.apply_at(-1) == 0


def test_fragments_take_turns_and_overlap_ends_at_the_last_inner_step() -> None:
    s = SyncSchedule(inner_steps=4, fragments=2, overlap=1, events=6)
    assert s.inner_total == 12
    assert [s.fragment(e) for e in range(6)] == [0, 1, 0, 1, 0, 1]
    assert [s.outer_round(e) for e in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [s.send_at(e) for e in range(6)] == [2, 4, 6, 8, 10, 12]
    assert [s.apply_at(e) for e in range(6)] == [3, 5, 7, 9, 11, 12]  # no inner step past the job's


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=40), st.integers(1, 40))
def test_partition_is_contiguous_non_empty_and_balanced(sizes: list[int], parts: int) -> None:
    named = {f"p{i}": n for i, n in enumerate(sizes)}
    if parts > len(sizes):
        with pytest.raises(ConfigError, match="replicas.fragments"):
            partition(named, parts)
        return
    groups = partition(named, parts)
    assert len(groups) == parts and all(groups)
    assert [n for g in groups for n in g] == list(named)  # every name once, in the model's order
    total = sum(sizes)
    # No group goes past its share by more than its own last tensor.
    assert all(sum(named[n] for n in g) - named[g[-1]] <= total / parts + 1e-9 or len(g) == 1 for g in groups)


@pytest.mark.parametrize(("section", "key"), [({"fragments": 3}, "replicas.fragments"),
                                              ({"fragments": 0}, "replicas.fragments"),
                                              ({"overlap_steps": 3}, "replicas.overlap_steps"),
                                              ({"mixing": 1.0}, "replicas.mixing")])
def test_a_bad_streaming_section_is_one_line_naming_the_key(tmp_path: Path, section: dict[str, object],
                                                            key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_job(settings_for(tmp_path, steps=2, **{**STREAMING, **section}))
    assert info.value.key == key



def test_streaming_replicas_agree_on_every_outer_step_and_end_on_it(tmp_path: Path) -> None:
    """Three replicas, two fragments synced in turn, one inner step of overlap: the outer
    weights are bit-identical after every event, the models differ while they overlap (each
    keeps half its own progress) and all end on the outer weights; each event sends one
    fragment, the two fragments together the whole model."""
    roles = run(settings_for(tmp_path, steps=10, **STREAMING), MemoryBroker())  # 5 rounds
    assert [r.worker.step for r in roles] == [10] * 3 and [r.trainer.trained for r in roles] == [20] * 3
    first = hooks_of(roles[0])
    assert sorted(first.outer) == list(range(1, 11))
    for r in roles[1:]:
        assert hooks_of(r).outer == first.outer
    assert hooks_of(roles[0]).model[10] == hooks_of(roles[1]).model[10] == first.outer[10]
    assert any(hooks_of(roles[0]).model[e] != hooks_of(roles[1]).model[e] for e in range(1, 10))
    whole = sum(v.nbytes for v in roles[0].trainer.start.values()) * 2  # float32, to both peers
    raw = history(tmp_path, "replica-0", "raw_bytes")
    assert len(raw) == 10 and all(0 < r < whole for r in raw) and raw[0] + raw[1] == whole
    curve = history(tmp_path, "replica-0")
    assert np.mean(curve[-2:]) < 0.6 * np.mean(curve[:2]), curve


def direct_streaming_diloco(settings: Any, n: int) -> dict[str, np.ndarray]:
    """Streaming DiLoCo written out on paddle models and numpy, without the job: every replica
    trains inner step ``t`` on ``batch(c, t)``; fragment ``s mod P`` leaves at ``(s+1) H/P``;
    after ``τ`` more steps its average is applied by Nesterov SGD and mixed into every replica."""
    import paddle
    from mlp_replicas import build_replica

    job = load_job(settings)
    specs = [build_replica(settings, c) for c in range(n)]
    opts = [paddle.optimizer.Adam(learning_rate=job.inner_lr, parameters=s.model.parameters()) for s in specs]
    params = [dict(s.model.named_parameters()) for s in specs]
    theta = {k: p.numpy().astype(np.float64) for k, p in params[0].items()}
    velocity = {k: np.zeros_like(v) for k, v in theta.items()}
    stride, tau, alpha = job.inner_steps // job.fragments, job.overlap_steps, job.mixing
    fragments = partition({k: v.size for k, v in theta.items()}, job.fragments)
    t, total = 0, settings.job.steps * stride

    def train_to(count: int) -> None:
        nonlocal t
        while t < count:
            for c, (spec, opt) in enumerate(zip(specs, opts)):
                (x,), (y,) = spec.batch(c, t)
                spec.loss(spec.model(paddle.to_tensor(x)), paddle.to_tensor(y)).backward()
                opt.step()
                opt.clear_grad()
            t += 1

    for s in range(settings.job.steps):
        names = fragments[s % job.fragments]
        train_to((s + 1) * stride)
        deltas = [{k: theta[k] - p[k].numpy() for k in names} for p in params]
        train_to(min((s + 1) * stride + tau, total))
        for k in names:
            mean = sum(d[k] for d in deltas) / n
            velocity[k] = job.outer_momentum * velocity[k] + mean
            theta[k] = theta[k] - job.outer_lr * (mean + job.outer_momentum * velocity[k])
            for p in params:
                p[k].set_value((alpha * p[k].numpy() + (1 - alpha) * theta[k]).astype(np.float32))
    return theta


def test_streaming_job_is_the_direct_streaming_diloco_update(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, steps=6, clusters=THREE[:2], codec="none", **STREAMING)
    roles = run(settings, MemoryBroker())
    expected = direct_streaming_diloco(settings, 2)
    for name, value in roles[0].trainer.start.items():
        np.testing.assert_allclose(value, expected[name], rtol=0, atol=2e-5, err_msg=name)


@pytest.mark.parametrize(("stopper", "builder", "expected"), [
    (lambda w: StopAt(w, 3), None, (3, 3, -1, False)),
    (lambda w: StopAfterSending(w, 3), None, (3, 3, 3, False)),
    (None, crashing(8), (3, 2, -1, True))], ids=["between-events", "after-sending", "crash-in-overlap"])
def test_a_streaming_replica_stopped_and_resumed_ends_bit_identical(
        tmp_path: Path, stopper: Callable[[Any], Hook] | None, builder: Builder | None,
        expected: tuple[int, int, int, bool]) -> None:
    """Stopped after sending event 3, its checkpoint holds the event's pseudo-gradient and the
    overlap's inner step; crashed in that overlap step (inner step 8), it resumes from event 2
    and sends events 2 and 3 again, which the others drop."""
    run(settings_for(tmp_path / "a", steps=8, **STREAMING), MemoryBroker())
    got = run_one_interrupted(settings_for(tmp_path / "c", steps=8, **STREAMING), MemoryBroker(), stopper, builder)
    assert got == expected
    for c in range(3):
        a = CheckpointStore(tmp_path / "a" / "checkpoints" / f"replica-{c}").latest()
        b = CheckpointStore(tmp_path / "c" / "checkpoints" / f"replica-{c}").latest()
        assert a is not None and b is not None and a.step == b.step == 8 and a.digest == b.digest, c
    assert history(tmp_path / "c", "replica-1") == history(tmp_path / "a", "replica-1")
