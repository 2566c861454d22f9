"""The ABNet encoder/decoder workers over the in-memory transport (worker logic only).

Cross-cluster behaviour on real brokers is tested in tests/integration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.settings import JobSettings, Settings
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import abnet_settings as tiny_settings
from tests.fixtures.pairs import assert_resume_matches_clean, memory_worker
from tests.fixtures.pairs import run_abnet_pair as run_pair
from tests.fixtures.threads import history

pytestmark = pytest.mark.paddle


def losses(run_dir: Path, worker: str) -> list[float]:
    return history(run_dir, worker, "loss")


def test_pipeline_trains_and_both_sides_reach_the_same_step(tmp_path: Path) -> None:
    settings = tiny_settings(tmp_path, steps=40)
    enc, dec = run_pair(settings, MemoryBroker())
    assert enc.worker.step == dec.worker.step == 40  # type: ignore[attr-defined]
    curve = losses(tmp_path, "dec-0")
    assert len(curve) == 40
    assert np.mean(curve[-8:]) < np.mean(curve[:8]) - 0.3
    # The encoder saw the same losses in the replies, in the same order.
    assert losses(tmp_path, "enc-0") == curve
    # Checkpoints of both sides are at the final step.
    assert CheckpointStore(tmp_path / "checkpoints" / "enc-0").latest().step == 40  # type: ignore[union-attr]
    assert CheckpointStore(tmp_path / "checkpoints" / "dec-0").latest().step == 40  # type: ignore[union-attr]


def test_runs_are_bit_identical_and_resume_continues_exactly(tmp_path: Path) -> None:
    a = tiny_settings(tmp_path / "a", steps=12)
    run_pair(a, MemoryBroker())
    b = tiny_settings(tmp_path / "b", steps=12)
    run_pair(b, MemoryBroker())
    for worker in ("enc-0", "dec-0"):
        da = CheckpointStore(tmp_path / "a" / "checkpoints" / worker).latest()
        db = CheckpointStore(tmp_path / "b" / "checkpoints" / worker).latest()
        assert da is not None and db is not None and da.digest == db.digest

    # Stop both sides at step 6 (SIGTERM path), then restart them on the same
    # broker: the resumed run ends bit-identical to the uninterrupted one.
    assert_resume_matches_clean(lambda d: tiny_settings(d, steps=12), run_pair, tmp_path / "resume",
                                ("enc-0", "dec-0"))


def test_a_resumed_rsvd_chain_ends_bit_identical(tmp_path: Path) -> None:
    """The rsvd warm-start basis is part of the head's checkpoint: stopped and resumed,
    the randomized low-rank chain encodes what an uninterrupted run encodes."""
    a = tiny_settings(tmp_path / "a", steps=12, forward="fp16(rsvd(0.6))")
    run_pair(a, MemoryBroker())
    c = tiny_settings(tmp_path / "c", steps=12, forward="fp16(rsvd(0.6))")
    broker = MemoryBroker()
    enc, dec = run_pair(c, broker, stop_at=6)
    assert enc.worker.step == dec.worker.step == 6
    resumed = CheckpointStore(tmp_path / "c" / "checkpoints" / "enc-0").latest()
    assert resumed is not None and "encoder/lowrank/enc_out" in resumed.arrays
    run_pair(c, broker)
    for worker in ("enc-0", "dec-0"):
        dc = CheckpointStore(tmp_path / "c" / "checkpoints" / worker).latest()
        da = CheckpointStore(tmp_path / "a" / "checkpoints" / worker).latest()
        assert dc is not None and da is not None
        assert dc.step == 12 and dc.digest == da.digest, worker


def test_uncompressed_lockstep_pipeline_equals_joint_training(tmp_path: Path) -> None:
    """With one micro-batch in flight and no compression, splitting the model across
    two workers and a queue changes nothing: same losses as one process training
    the joint model on the same batches."""
    from nebula_mq.models.abnet import ABNet
    from workers.abnet.job import adapter_optimizer, load_job, load_side, model_config

    settings = tiny_settings(tmp_path, steps=8, in_flight=1, forward="none", backward="none")
    run_pair(settings, MemoryBroker())
    pipelined = losses(tmp_path, "dec-0")

    job = load_job(settings)
    cfg = model_config(job, settings.job.seed)
    model = ABNet(cfg)
    enc_opt = adapter_optimizer(job, model.encoder.trainable_parameters())
    dec_opt = adapter_optimizer(job, model.decoder.trainable_parameters())
    src = load_side(job, settings.job.seed, "src", cfg.encoder.vocab)
    tgt = load_side(job, settings.job.seed, "tgt", cfg.decoder.vocab)
    joint = []
    for mb in range(8):
        sample_ids, ids, mask = src.source(mb)
        loss = model.loss(ids, mask, tgt.targets(sample_ids))
        loss.backward()
        enc_opt.step(), dec_opt.step(), enc_opt.clear_grad(), dec_opt.clear_grad()
        joint.append(float(loss))
    np.testing.assert_allclose(pipelined, joint, rtol=1e-5)


def test_learning_rate_warms_up_then_decays_to_its_floor() -> None:
    from workers.abnet.job import AbnetJob, learning_rate

    steps = 100
    cosine = AbnetJob(lr=1e-3, warmup_steps=10, lr_decay="cosine", min_lr_ratio=0.1)
    lrs = [learning_rate(cosine, steps, s) for s in range(steps)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))  # warm-up rises
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))  # then decays
    assert lrs[-1] == pytest.approx(1e-4)
    assert lrs[55] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + np.cos(np.pi * 45 / 89)))
    linear = AbnetJob(lr=1e-3, warmup_steps=10, lr_decay="linear", min_lr_ratio=0.0)
    assert learning_rate(linear, steps, 99) == 0.0
    assert learning_rate(linear, steps, 54) == pytest.approx(1e-3 * (1 - 44 / 89))
    assert learning_rate(AbnetJob(lr=1e-3, warmup_steps=10), steps, 99) == 1e-3  # "none" stays
    assert learning_rate(AbnetJob(lr=1e-3), steps, 0) == 1e-3  # no warm-up
    with pytest.raises(ValueError):
        AbnetJob(min_lr_ratio=1.5).validate()


@pytest.mark.parametrize("on_collapse", ["stop", "warn"])
def test_a_collapsed_encoder_stops_the_job_or_warns(tmp_path: Path, on_collapse: str) -> None:
    """Every token the same vector: "stop" raises a typed error before the next checkpoint
    can overwrite a good one; "warn" records the spread and goes on."""
    import dataclasses
    import types

    import paddle

    from nebula_mq.errors import TrainingDiverged
    from workers.abnet.encoder import AbnetEncoder
    from workers.split.head import Forward

    base = tiny_settings(tmp_path, steps=4)
    settings = dataclasses.replace(base, abnet={**base.section("abnet"), "on_collapse": on_collapse})
    enc = AbnetEncoder(settings, memory_worker(AbnetEncoder.identity(settings), MemoryBroker()))
    mask = np.ones((2, 5), dtype=np.float32)
    reply = (types.SimpleNamespace(meta={"loss": 2.5}),)  # the step's one reply
    healthy = Forward(np.arange(2), paddle.randn([2, 5, 8]), {"src_mask": mask})
    assert enc.step_values(reply, healthy)["token_spread"] > 0.5  # type: ignore[arg-type]
    collapsed = Forward(np.arange(2), paddle.ones([2, 5, 8]), {"src_mask": mask})
    if on_collapse == "stop":
        with pytest.raises(TrainingDiverged, match="collapsed"):
            enc.step_values(reply, collapsed)  # type: ignore[arg-type]
    else:
        values = enc.step_values(reply, collapsed)  # type: ignore[arg-type]
        assert values["token_spread"] == 0.0 and values["loss"] == 2.5


def feedback_settings(run_dir: Path, steps: int) -> Settings:
    """Delta activations + gradient error feedback on 48 samples: 3 micro-batches per
    epoch, so every sample comes back several times within the run."""
    base = tiny_settings(run_dir, steps=steps, forward="int8", backward="int8")
    import dataclasses

    return dataclasses.replace(base, abnet={**base.section("abnet"), "train_samples": 48,
                                            "forward_feedback": "delta", "backward_feedback": "residual"})


def test_delta_and_error_feedback_resume_bit_identical(tmp_path: Path) -> None:
    """The AQ-SGD caches (S and its mirror on T) and T's gradient residuals are part of
    the checkpoints: stopping at step 6 and resuming ends exactly where a clean run ends,
    and the mirror equals the sender's cache bit for bit."""
    assert_resume_matches_clean(lambda d: feedback_settings(d, steps=12), run_pair, tmp_path, ("enc-0", "dec-0"))
    s_ck = CheckpointStore(tmp_path / "a" / "checkpoints" / "enc-0").latest()
    t_ck = CheckpointStore(tmp_path / "a" / "checkpoints" / "dec-0").latest()
    assert s_ck is not None and t_ck is not None
    assert len(s_ck.arrays["encoder/delta/ids"]) == 48
    for part in ("ids", "lengths", "rows"):
        np.testing.assert_array_equal(s_ck.arrays[f"encoder/delta/{part}"], t_ck.arrays[f"decoder/delta/{part}"])
    assert np.abs(t_ck.arrays["decoder/feedback/rows"]).max() > 0


def test_delta_compression_tracks_the_activation(tmp_path: Path) -> None:
    """After a few epochs the decoder's reconstruction is much closer to the activation
    the encoder computed than one-shot int8 is."""
    from nebula_mq.codecs import Int8
    from nebula_mq.codecs.feedback import roundtrip
    from nebula_mq.codecs.feedback import SampleRows
    import paddle

    settings = feedback_settings(tmp_path, steps=15)
    enc, dec = run_pair(settings, MemoryBroker())
    # Recompute the activations of the last epoch's batches with the final encoder,
    # as the messages of a next epoch would carry them.
    mirror = dec.incoming[0].mirror.cache  # type: ignore[attr-defined]
    assert isinstance(mirror, SampleRows)
    errs, plain = [], []
    for mb in range(15, 18):
        with paddle.no_grad():
            ids, mask, out = enc._forward(mb)  # type: ignore[attr-defined]
        x = out.numpy()
        lengths = mask.sum(1).astype(np.int64)
        ref = mirror.gather(ids, lengths, x.shape[1], x.shape[2])
        valid = np.arange(x.shape[1])[None, :] < lengths[:, None]
        errs.append(np.abs(roundtrip(x - ref, Int8()) + ref - x)[valid].max())
        plain.append(np.abs(roundtrip(x, Int8()) - x)[valid].max())
    assert max(errs) < min(plain) / 3


def test_abnet_placement_is_the_split_jobs_and_reads_the_older_spelling() -> None:
    """[abnet] extends [split]'s placement (the encoder is the head); src_cluster, tgt_cluster and
    encoder_id still mean head_cluster, tail_cluster and head_id, and giving both is an error."""
    from nebula_mq.errors import ConfigError
    from workers.abnet.job import load_job
    from workers.split.job import Placement

    def load(abnet: dict[str, str]) -> Any:
        return load_job(Settings(job=JobSettings(id="placement"), abnet=abnet))

    new = load({"head_cluster": "a", "tail_cluster": "b", "head_id": "enc-7"})
    old = load({"src_cluster": "a", "tgt_cluster": "b", "encoder_id": "enc-7"})
    assert isinstance(new, Placement) and new == old
    assert (new.head_cluster, new.tail_cluster, new.head_id, new.tail_id) == ("a", "b", "enc-7", "dec-0")
    act, reply = new.flows()
    assert (act.src_cluster, act.dst_cluster, reply.src_cluster, reply.dst_cluster) == ("a", "b", "b", "a")
    with pytest.raises(ConfigError, match="abnet.tgt_cluster"):
        load({"tgt_cluster": "b", "tail_cluster": "c"})
    # Both sides on one cluster (the in-cluster baseline): every flow stays on that broker.
    assert not any(f.crosses_clusters for f in load({"src_cluster": "a", "tail_cluster": "a"}).flows())
