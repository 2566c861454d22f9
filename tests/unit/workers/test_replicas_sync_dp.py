"""The replicas job's baseline, ``exchange = "gradients"``: synchronous data parallelism across
clusters (every inner step's gradient to every cluster, the inner optimizer on their mean),
over the in-memory transport; against a direct implementation, resumed bit-identically, and
in PyTorch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nebula_mq.errors import ConfigError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.replicas import (THREE, StopAfterSending, hooks_of, run, run_one_interrupted, settings_for,
                                     torch_replica)
from tests.fixtures.threads import history
from workers.replicas.job import load_job

pytestmark = pytest.mark.paddle

SYNC = {"exchange": "gradients", "inner_steps": 1, "codec": "none", "error_feedback": False}


@pytest.mark.parametrize("section", [{"exchange": "gradients"}, {**SYNC, "overlap_steps": 1}, {"exchange": "grads"}])
def test_gradients_only_with_one_inner_step_one_fragment_and_no_overlap(tmp_path: Path,
                                                                       section: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as info:
        load_job(settings_for(tmp_path, steps=2, **section))
    assert info.value.key == "replicas.exchange"


def test_sync_data_parallelism_is_adam_on_the_mean_gradient(tmp_path: Path) -> None:
    """Two replicas exchanging gradients train exactly as one model whose Adam steps on the
    mean of the two shards' gradients, and hold bit-identical weights after every step."""
    import paddle
    from mlp_replicas import build_replica

    settings = settings_for(tmp_path, steps=6, clusters=THREE[:2], **SYNC)
    roles = run(settings, MemoryBroker())
    assert hooks_of(roles[0]).outer == hooks_of(roles[1]).outer == hooks_of(roles[0]).model
    assert sorted(hooks_of(roles[0]).outer) == list(range(1, 7))
    spec = build_replica(settings, 0)
    opt = paddle.optimizer.Adam(learning_rate=load_job(settings).inner_lr, parameters=spec.model.parameters())
    params = dict(spec.model.named_parameters())
    for step in range(6):
        grads = []
        for shard in range(2):
            (x,), (y,) = spec.batch(shard, step)
            spec.loss(spec.model(paddle.to_tensor(x)), paddle.to_tensor(y)).backward()
            grads.append({k: p.grad.numpy().copy() for k, p in params.items()})
            opt.clear_grad()
        spec.loss(spec.model(paddle.to_tensor(x)), paddle.to_tensor(y)).backward()  # grads to overwrite
        for k, p in params.items():
            p.grad.set_value((grads[0][k] + grads[1][k]) / 2)
        opt.step()
        opt.clear_grad()
    for name, value in roles[0].trainer.start.items():
        np.testing.assert_allclose(value, params[name].numpy(), rtol=0, atol=1e-6, err_msg=name)
    raw = history(tmp_path, "replica-0", "raw_bytes")
    assert raw == [sum(v.nbytes for v in roles[0].trainer.start.values())] * 6  # every gradient, float32, to one peer
    sent = history(tmp_path, "replica-0", "sent_bytes")
    assert all(r <= s < r + 512 for r, s in zip(raw, sent)), (raw, sent)  # on the wire as float32: codec none


def test_a_sync_replica_stopped_after_sending_resumes_bit_identically(tmp_path: Path) -> None:
    """Stopped after sending step 3's gradient, its checkpoint holds that gradient; restarted
    in a fresh process there is no gradient on its parameters yet, and the mean is set anyway."""
    run(settings_for(tmp_path / "a", steps=6, **SYNC), MemoryBroker())
    got = run_one_interrupted(settings_for(tmp_path / "c", steps=6, **SYNC), MemoryBroker(),
                              lambda w: StopAfterSending(w, 3))
    assert got == (3, 3, 3, False)
    for c in range(3):
        a = CheckpointStore(tmp_path / "a" / "checkpoints" / f"replica-{c}").latest()
        b = CheckpointStore(tmp_path / "c" / "checkpoints" / f"replica-{c}").latest()
        assert a is not None and b is not None and a.step == b.step == 6 and a.digest == b.digest, c


def test_torch_sync_replicas_hold_identical_weights(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    roles = run(settings_for(tmp_path, steps=4, clusters=THREE[:2], **SYNC), MemoryBroker(), torch_replica)
    assert [r.trainer.fw.name for r in roles] == ["torch", "torch"]
    assert hooks_of(roles[0]).outer == hooks_of(roles[1]).outer == hooks_of(roles[0]).model
    curve = history(tmp_path, "replica-0")
    assert len(curve) == 4 and all(np.isfinite(curve))
