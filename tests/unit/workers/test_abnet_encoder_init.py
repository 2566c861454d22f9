"""Scenario I feeds Scenario II (workers.abnet.encoder_init): the discriminator a short ELECTRA
run trained becomes the ABNet encoder's stack, which then trains its adapters from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from nebula_mq.errors import ConfigError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.settings import Settings
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import abnet_settings, electra_settings, memory_worker, run_abnet_pair, run_electra_pair
from tests.fixtures.threads import history

pytestmark = pytest.mark.paddle


ELECTRA_JOB = """
[job]
id = "unit-electra"
scenario = "electra"
seed = 5
steps = 10
run_dir = "{run_dir}"

[electra]
generator_clusters = ["cluster-a"]
disc_cluster = "cluster-b"
n_sub = 1
max_lead = 2
checkpoint_every = 5
heldout = 32

[electra.model]
preset = "tiny"
"""


def with_init(settings: Settings, init: str) -> Settings:
    return dataclasses.replace(settings, abnet={**settings.section("abnet"), "encoder_init": init})


@pytest.fixture(scope="module")
def scenario_i(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short Scenario I run (10 steps, the root discriminator checkpointed at 5 and 10), and its
    job file beside its run folder."""
    root = tmp_path_factory.mktemp("scenario-i")
    run_electra_pair(electra_settings(root / "run", steps=10), MemoryBroker())
    (root / "electra.toml").write_text(ELECTRA_JOB.format(run_dir=root / "run"))
    return root


def test_a_scenario_i_job_file_names_its_latest_root_discriminator(scenario_i: Path) -> None:
    from workers.abnet.encoder_init import discriminator_state

    arrays, kept, step = discriminator_state(str(scenario_i / "electra.toml"), "")
    disc = CheckpointStore(scenario_i / "run" / "checkpoints" / "disc-root").latest()
    assert disc is not None and step == disc.step == 10 and kept is None  # synthetic data: no pruned vocabulary
    assert arrays.keys() == {k[len("model/encoder."):] for k in disc.arrays if k.startswith("model/encoder.")}


def test_the_scenario_i_discriminator_becomes_the_encoder_and_the_adapters_train_from_it(
        tmp_path: Path, scenario_i: Path) -> None:
    disc = CheckpointStore(scenario_i / "run" / "checkpoints" / "disc-root").latest()
    assert disc is not None and disc.path is not None

    settings = with_init(abnet_settings(tmp_path / "abnet", steps=40, in_flight=2), str(disc.path))
    enc, _dec = run_abnet_pair(settings, MemoryBroker())
    stack = {n[len("stack."):]: p.numpy() for n, p in enc.model.named_parameters()
             if n.startswith("stack.") and ".after_" not in n}
    copied = [n for n in stack if n.startswith("layers.")]
    assert len(copied) >= 30
    for name in copied:  # every transformer layer is the discriminator's, still after training (frozen)
        np.testing.assert_array_equal(stack[name], disc.arrays[f"model/encoder.{name}"], err_msg=name)
    np.testing.assert_array_equal(stack["embeddings.position.weight"],
                                  disc.arrays["model/encoder.embeddings.position.weight"][:64])

    from nebula_mq.models import abnet_config
    from nebula_mq.models.abnet import EncoderSide

    own = dict(EncoderSide(abnet_config.preset("tiny", seed=3)).named_parameters())
    assert not np.array_equal(own["stack.layers.0.attention.query.weight"].numpy(),
                              stack["layers.0.attention.query.weight"])  # not the preset's own init
    losses = history(tmp_path / "abnet", "dec-0", "loss")
    assert len(losses) == 40 and np.mean(losses[-5:]) < np.mean(losses[:5]), losses


@pytest.mark.parametrize("case", ["empty folder", "abnet job file"])
def test_an_encoder_init_that_names_no_discriminator_is_a_config_error(tmp_path: Path, case: str) -> None:
    from workers.abnet.encoder import AbnetEncoder

    if case == "empty folder":
        init = tmp_path / "nothing"
        init.mkdir()
    else:
        init = Path(__file__).resolve().parents[3] / "config" / "demo.toml"
    settings = with_init(abnet_settings(tmp_path / "abnet", steps=4), str(init))
    with pytest.raises(ConfigError, match="abnet.encoder_init"):
        AbnetEncoder(settings, memory_worker(AbnetEncoder.identity(settings), MemoryBroker()))


def test_an_override_given_for_the_abnet_job_does_not_reach_the_scenario_i_file_it_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.abnet.encoder_init import discriminator_state

    job = tmp_path / "electra.toml"
    job.write_text(ELECTRA_JOB.format(run_dir=tmp_path / "never-run"))
    monkeypatch.setenv("NEBULA__ABNET__ENCODER_INIT", str(job))  # for the ABNet job, not for this file
    monkeypatch.setenv("NEBULA__JOB__RUN_DIR", str(tmp_path / "abnet-run"))
    with pytest.raises(ConfigError, match=r"a Scenario I job with a discriminator checkpoint.*never-run"):
        discriminator_state(str(job), "abnet.toml")
