"""ELECTRA generator/discriminator steps on the tiny config: learning, determinism, checkpoints, M3."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("paddle")

from nebula_mq.errors import ConfigError, DataError, MalformedMessage, ShapeMismatch, WorkerError  # noqa: E402
from nebula_mq.models.electra import ElectraConfig, GeneratorConfig, electra_config  # noqa: E402
from nebula_mq.models.electra_trainers import DiscriminatorTrainer, GeneratorTrainer  # noqa: E402
from nebula_mq.runtime.checkpoint import CheckpointStore, state_digest  # noqa: E402

pytestmark = pytest.mark.paddle


def _sentences(rng: np.random.Generator, n: int) -> list[list[int]]:
    """A toy language: 40 word ids, each sentence an arithmetic walk (learnable context)."""
    out = []
    for _ in range(n):
        length, start, stride = rng.integers(12, 28), rng.integers(0, 40), rng.integers(1, 3)
        out.append([int((start + stride * i) % 40 + 5) for i in range(length)])
    return out


def _run(cfg: ElectraConfig, steps: int, seed: int = 0) -> tuple[GeneratorTrainer, DiscriminatorTrainer, list, list]:
    rng = np.random.default_rng(seed)
    gen, disc = GeneratorTrainer(cfg), DiscriminatorTrainer(cfg)
    g_hist, d_hist = [], []
    for _ in range(steps):
        batch, g = gen.train_step(gen.build_inputs(_sentences(rng, cfg.batch_size)))
        g_hist.append(g)
        d_hist.append(disc.train_step(batch))
    return gen, disc, g_hist, d_hist


def test_generator_and_discriminator_losses_decrease() -> None:
    cfg = electra_config({"preset": "tiny"})
    gen, disc, g, d = _run(cfg, 30)
    first, last = slice(0, 5), slice(-5, None)
    mean = lambda hist, key, s: float(np.mean([h[key] for h in hist[s]]))  # noqa: E731
    assert mean(g, "mlm_loss", last) < mean(g, "mlm_loss", first) - 0.5
    assert mean(d, "rtd_loss", last) < mean(d, "rtd_loss", first) - 0.15
    assert mean(d, "clm_loss", last) < mean(d, "clm_loss", first) - 0.5
    assert mean(d, "total_loss", last) < mean(d, "total_loss", first)
    # The total of eq. 11 is L_G (from the generator) + λ L_D + γ L_CLM.
    one = d[-1]
    assert one["total_loss"] == pytest.approx(one["mlm_loss"] + 50.0 * one["rtd_loss"] + one["clm_loss"], rel=1e-6)
    # Held-out evaluation helpers: the trained generator beats chance on unseen sentences.
    held = [gen.build_inputs(_sentences(np.random.default_rng(99), 8)) for _ in range(2)]
    ev = gen.evaluate(held)
    assert ev["mlm_acc"] > 1.0 / 40
    rtd = disc.evaluate([gen.corrupt_without_training(ids, seed=i)[0] for i, ids in enumerate(held)])
    assert 0.0 <= rtd["rtd_replaced_recall"] <= 1.0 and rtd["rtd_acc"] > 0.8


def test_three_steps_twice_give_bit_identical_states() -> None:
    cfg = electra_config({"preset": "tiny"})
    a_gen, a_disc, _, a_hist = _run(cfg, 3)
    b_gen, b_disc, _, b_hist = _run(cfg, 3)
    assert state_digest(a_gen.state_arrays()) == state_digest(b_gen.state_arrays())
    assert state_digest(a_disc.state_arrays()) == state_digest(b_disc.state_arrays())
    assert a_hist == b_hist
    c_gen, _, _, _ = _run(dataclasses.replace(cfg, seed=7), 3)
    assert state_digest(c_gen.state_arrays()) != state_digest(a_gen.state_arrays())


def test_checkpoint_resume_replays_bit_identically(tmp_path) -> None:
    cfg = electra_config({"preset": "tiny"})
    rng = np.random.default_rng(3)
    data = [GeneratorTrainer(cfg).build_inputs(_sentences(rng, cfg.batch_size)) for _ in range(4)]
    gen, disc = GeneratorTrainer(cfg), DiscriminatorTrainer(cfg)
    for ids in data[:2]:
        disc.train_step(gen.train_step(ids)[0])
    store = CheckpointStore(tmp_path)
    store.save(2, {**{f"g/{k}": v for k, v in gen.state_arrays().items()},
                   **{f"d/{k}": v for k, v in disc.state_arrays().items()}})
    for ids in data[2:]:
        disc.train_step(gen.train_step(ids)[0])

    ck = store.load(2)
    gen2, disc2 = GeneratorTrainer(cfg), DiscriminatorTrainer(cfg)
    gen2.load_state_arrays({k[2:]: v for k, v in ck.arrays.items() if k.startswith("g/")})
    disc2.load_state_arrays({k[2:]: v for k, v in ck.arrays.items() if k.startswith("d/")})
    assert gen2.step == 2 and state_digest(gen2.state_arrays()) == state_digest(
        {k[2:]: v for k, v in ck.arrays.items() if k.startswith("g/")})
    for ids in data[2:]:
        disc2.train_step(gen2.train_step(ids)[0])
    assert state_digest(gen2.state_arrays()) == state_digest(gen.state_arrays())
    assert state_digest(disc2.state_arrays()) == state_digest(disc.state_arrays())
    with pytest.raises(Exception) as err:
        disc2.load_state_arrays({"trainer/step": np.array([1])})
    assert err.type.__name__ == "CheckpointError"


def test_micro_batch_accumulation_equals_one_big_batch_and_is_enforced() -> None:
    base = electra_config({"preset": "tiny"})
    two = dataclasses.replace(base, generators=(dataclasses.replace(base.generators[0], micro_batches=2),))
    gen = GeneratorTrainer(two)
    ids = gen.build_inputs(_sentences(np.random.default_rng(4), 4))
    batch_a, _ = gen.make_micro_batch(ids)
    batch_b, _ = gen.make_micro_batch(ids)
    # Different masking per micro-batch (the RNG is keyed by micro-batch index), same labels.
    assert not np.array_equal(batch_a["masked_positions"], batch_b["masked_positions"])
    assert np.array_equal(batch_a["labels"], batch_b["labels"])
    with pytest.raises(WorkerError):
        gen.make_micro_batch(ids)
    assert gen.apply_update()["step"] == 1.0
    with pytest.raises(WorkerError):
        gen.apply_update()


def test_micro_batch_wire_contract_and_bad_input() -> None:
    cfg = electra_config({"preset": "tiny"})
    gen, disc = GeneratorTrainer(cfg), DiscriminatorTrainer(cfg)
    ids = gen.build_inputs(_sentences(np.random.default_rng(5), 4))
    batch, _ = gen.train_step(ids)
    assert {k: v.dtype.name for k, v in batch.items()} == {
        "input_ids": "int32", "labels": "int32", "replaced": "uint8", "masked_positions": "uint8",
        "attention_mask": "uint8", "mlm_loss": "float32"}
    # Replaced tokens are exactly where the corrupted id differs from the label, always inside M.
    assert np.array_equal(batch["replaced"].astype(bool), batch["input_ids"] != batch["labels"])
    assert not (batch["replaced"].astype(bool) & ~batch["masked_positions"].astype(bool)).any()
    with pytest.raises(MalformedMessage):
        disc.train_step({k: v for k, v in batch.items() if k != "replaced"})
    with pytest.raises(ShapeMismatch):
        disc.train_step({**batch, "labels": batch["labels"][:, :-1]})
    with pytest.raises(MalformedMessage):
        disc.train_step({**batch, "input_ids": batch["input_ids"] + cfg.vocab_size})
    with pytest.raises(MalformedMessage):
        gen.train_step(ids - 100)


def test_m3_generators_have_their_own_task_and_group() -> None:
    cfg = electra_config({"preset": "tiny", "generators": [
        {"size": {"hidden": 32, "layers": 1, "heads": 2, "ffn": 64}, "task": "mlm", "group": "romance"},
        {"size": {"hidden": 32, "layers": 1, "heads": 2, "ffn": 64}, "task": "trtd", "group": "es-en", "seed": 2}]})
    assert isinstance(cfg.generators[1], GeneratorConfig)
    mono, pair = GeneratorTrainer(cfg, 0), GeneratorTrainer(cfg, 1)
    assert (mono.task.task_id, pair.task.task_id, pair.gen.group) == ("mlm", "trtd", "es-en")
    src, tgt = [10, 11, 12, 13, 14], [20, 21, 22]
    ids = pair.build_inputs([(src, tgt)] * 6)
    assert ids[0, :12].tolist() == [cfg.bos_id, *src, cfg.eos_id, cfg.eos_id, *tgt, cfg.eos_id]
    # Masking falls on both languages of the pair across a batch.
    src, tgt = list(range(10, 20)), list(range(30, 40))
    batch, _ = pair.train_step(pair.build_inputs([(src, tgt)] * 16))
    masked = batch["masked_positions"].astype(bool)
    assert masked[:, 1:11].sum() > 5 and masked[:, 13:23].sum() > 5
    # One discriminator trains on micro-batches from both generators.
    disc = DiscriminatorTrainer(cfg)
    disc.train_step(mono.train_step(mono.build_inputs(_sentences(np.random.default_rng(0), 4)))[0])
    assert disc.train_step(batch)["step"] == 2.0
    # Long pairs are trimmed to max_len, keeping both halves.
    long_ids = pair.build_inputs([(list(range(5, 45)), list(range(50, 90)))])
    assert long_ids.shape == (1, cfg.max_len) and (long_ids[0] >= 50).sum() > 5


def test_config_presets_and_errors() -> None:
    small = electra_config({"preset": "small", "discriminator": {"layers": 2}, "rtd_weight": 30})
    assert (small.discriminator.layers, small.discriminator.hidden, small.rtd_weight) == (2, 128, 30.0)
    assert electra_config({"preset": "pretrained"}).discriminator.hidden == 384
    with pytest.raises(ConfigError):
        electra_config({"preset": "huge"})
    with pytest.raises(ConfigError):
        electra_config({"preset": "tiny", "generators": [{"size": {"hidden": 30, "layers": 1, "heads": 4, "ffn": 8}}]})
    with pytest.raises(ConfigError):
        electra_config({"preset": "tiny", "lamda": 3})
    with pytest.raises(DataError):
        DiscriminatorTrainer(electra_config({"preset": "pretrained"}))
    with pytest.raises(DataError):
        electra_config({"preset": "pretrained"}).with_pruned_vocab(np.arange(10))


def test_batches_without_maskable_tokens_are_refused() -> None:
    cfg = electra_config({"preset": "tiny"})
    gen, disc = GeneratorTrainer(cfg), DiscriminatorTrainer(cfg)
    only_specials = np.full((2, cfg.max_len), cfg.pad_id, dtype=np.int32)
    only_specials[:, 0], only_specials[:, 1] = cfg.bos_id, cfg.eos_id
    with pytest.raises(DataError):
        gen.train_step(only_specials)
    batch, _ = gen.train_step(gen.build_inputs(_sentences(np.random.default_rng(6), 2)))
    with pytest.raises(MalformedMessage):
        disc.train_step({**batch, "masked_positions": np.zeros_like(batch["masked_positions"])})
