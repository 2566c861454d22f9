"""The replicas job (DiLoCo across clusters, workers/replicas) over the in-memory transport: each
replica in its own thread on its own cluster, on the split example's MLP as one whole model
(examples/split_mlp/mlp_replicas.py). Real brokers: tests/integration/test_replicas_e2e.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.hooks import Hook
from nebula_mq.settings import Settings
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import SPLIT_EXAMPLE
from tests.fixtures.replicas import (THREE, Builder, Rounds, StopAfterSending, crashing, hooks_of, run,
                                     run_one_interrupted, settings_for, torch_replica)
from tests.fixtures.threads import StopAt, history
from workers.replicas.job import ReplicaSpec, load_job

pytestmark = pytest.mark.paddle


@pytest.mark.parametrize("clusters", [THREE[:2], THREE], ids=["two", "three"])
def test_replicas_train_and_hold_identical_weights_after_every_outer_step(tmp_path: Path,
                                                                          clusters: tuple[str, ...]) -> None:
    roles = run(settings_for(tmp_path, steps=8, clusters=clusters), MemoryBroker())
    assert [r.worker.step for r in roles] == [8] * len(clusters)
    first = hooks_of(roles[0])
    assert sorted(first.outer) == list(range(1, 9))
    for r in roles[1:]:
        assert hooks_of(r).outer == first.outer  # every round, bit for bit
    for r in roles:
        assert hooks_of(r).model == first.outer  # and the model took the outer weights
    for c in range(len(clusters)):
        curve = history(tmp_path, f"replica-{c}")
        assert len(curve) == 8 and np.mean(curve[-2:]) < 0.6 * np.mean(curve[:2]), curve
        sent = history(tmp_path, f"replica-{c}", "sent_bytes")
        raw = history(tmp_path, f"replica-{c}", "raw_bytes")
        assert all(s < 0.3 * w for s, w in zip(sent, raw))  # int8: about a quarter of float32
    finals = [CheckpointStore(tmp_path / "checkpoints" / f"replica-{c}").latest() for c in range(len(clusters))]
    assert all(ck is not None and ck.step == 8 for ck in finals)
    outer = [{k: v for k, v in ck.arrays.items() if k.startswith("outer/param/")} for ck in finals if ck]
    assert all(Rounds.digest(o) == Rounds.digest(outer[0]) for o in outer)


@pytest.mark.parametrize(("stopper", "builder", "expected"), [
    (lambda w: StopAt(w, 3), None, (3, 3, -1, False)),
    (lambda w: StopAfterSending(w, 3), None, (3, 3, 3, False)),
    (None, crashing(27), (5, 4, -1, True))], ids=["between-rounds", "after-sending", "crash"])
def test_a_replica_stopped_and_resumed_ends_bit_identical_to_an_uninterrupted_run(
        tmp_path: Path, stopper: Callable[[Any], Hook] | None, builder: Builder | None,
        expected: tuple[int, int, int, bool]) -> None:
    """Stopped between two rounds, it trains its next round after the restart; stopped after
    sending round 3 (checkpoints fall every 2), its checkpoint holds that round's decoded
    pseudo-gradient and it neither retrains nor resends it; crashed in round 5's inner steps,
    it resumes from step 4 and redoes round 4: the others drop the pseudo-gradient it sends
    again, and the broker delivers again theirs of round 4, unacked when it crashed."""
    run(settings_for(tmp_path / "a", steps=7), MemoryBroker())
    assert run_one_interrupted(settings_for(tmp_path / "c", steps=7), MemoryBroker(), stopper, builder) == expected
    for c in range(3):
        a = CheckpointStore(tmp_path / "a" / "checkpoints" / f"replica-{c}").latest()
        b = CheckpointStore(tmp_path / "c" / "checkpoints" / f"replica-{c}").latest()
        assert a is not None and b is not None and a.step == b.step == 7 and a.digest == b.digest, c
    assert history(tmp_path / "c", "replica-1") == history(tmp_path / "a", "replica-1")


def same_data(settings: Settings, index: int) -> ReplicaSpec:
    """Every replica trains on shard 0: their pseudo-gradients are equal."""
    from mlp_replicas import build_replica

    spec = build_replica(settings, index)
    return ReplicaSpec(spec.model, spec.loss, lambda _shard, step: spec.batch(0, step))


def test_outer_lr_one_without_momentum_on_equal_shards_is_plain_local_training(tmp_path: Path) -> None:
    """The sanity identity: with equal pseudo-gradients, no compression, outer lr 1 and no
    momentum, the outer step gives every replica its own inner weights back (to float32
    rounding of θ − (θ − θ_c)), so the job trains as one model with its inner optimizer."""
    import paddle
    from mlp_replicas import build_replica

    settings = settings_for(tmp_path, steps=4, clusters=THREE[:2], codec="none", outer_lr=1.0, outer_momentum=0.0)
    roles = run(settings, MemoryBroker(), same_data)
    spec = build_replica(settings, 0)
    opt = paddle.optimizer.Adam(learning_rate=load_job(settings).inner_lr, parameters=spec.model.parameters())
    for step in range(4 * 5):
        (x,), (y,) = spec.batch(0, step)
        loss = spec.loss(spec.model(paddle.to_tensor(x)), paddle.to_tensor(y))
        loss.backward()
        opt.step()
        opt.clear_grad()
    local = {name: p.numpy() for name, p in spec.model.named_parameters()}
    for name, value in roles[0].trainer.start.items():
        np.testing.assert_allclose(value, local[name], rtol=0, atol=1e-5)


def test_torch_replicas_train_and_hold_identical_weights(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    roles = run(settings_for(tmp_path, steps=6, clusters=THREE[:2]), MemoryBroker(), torch_replica)
    assert [r.trainer.fw.name for r in roles] == ["torch", "torch"]
    assert hooks_of(roles[0]).outer == hooks_of(roles[1]).outer == hooks_of(roles[0]).model
    curve = history(tmp_path, "replica-0")
    assert np.mean(curve[-2:]) < 0.7 * np.mean(curve[:2]), curve


def test_a_replica_built_with_other_weights_stops_the_job_naming_it(tmp_path: Path) -> None:
    """Every replica must start from the same weights: each message carries the digest of the
    weights its round started from, and a replica that differs is named, not averaged."""
    import mlp
    import paddle
    from mlp_replicas import build_replica

    def odd_one(settings: Settings, index: int) -> ReplicaSpec:
        spec = build_replica(settings, index)
        model = paddle.nn.Sequential(mlp.bottom(seed=5), mlp.top(seed=6)) if index == 1 else spec.model
        return ReplicaSpec(model, spec.loss, spec.batch)

    # Whichever of the two applies round 0 first names the other.
    with pytest.raises(AssertionError, match=r"replica-(0: event 0: replica-1|1: event 0: replica-0) started from other"):
        run(settings_for(tmp_path, steps=3, clusters=THREE[:2]), MemoryBroker(), odd_one)


def test_the_shipped_job_finds_its_model_beside_the_example_and_bad_builders_are_one_line(tmp_path: Path) -> None:
    import dataclasses

    from nebula_mq.errors import ConfigError
    from workers.registry import load_job_settings
    from workers.replicas.spec import load_spec

    shipped = load_job_settings(SPLIT_EXAMPLE.parents[1] / "config" / "replicas.toml", environ={})
    spec = load_spec(shipped, 2)  # model_dir = "../examples/split_mlp", relative to the job file
    assert isinstance(spec, ReplicaSpec) and type(spec.model).__name__ == "Sequential"
    for target, expected in (("nowhere:build", "an importable 'module:function'"),
                             ("mlp:build_head", "a function(settings, cluster index)"),
                             ("mlp_replicas:whole", "a function(settings, cluster index)"),
                             ("mlp_replicas:shard_batch", "a function returning ReplicaSpec"),
                             ("mlp", "'package.module:function'")):
        bad = dataclasses.replace(shipped, replicas={**shipped.section("replicas"), "model": target})  # type: ignore[call-arg]
        with pytest.raises(ConfigError) as info:
            load_spec(bad, 0)
        assert info.value.key == "replicas.model" and expected in str(info.value), str(info.value)
