"""Scenario I roles over the in-memory transport, in threads (worker logic only).

One discriminator rank here (a gloo group needs one process per rank); the
multi-rank group on real brokers is in tests/integration/test_electra_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nebula_mq.errors import ConfigError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import TWO_GENERATORS
from tests.fixtures.pairs import electra_settings as settings_for
from tests.fixtures.pairs import run_electra_pair as run_pair
from tests.fixtures.threads import history
from workers.electra.common import choose_n
from workers.electra.flows import flows
from workers.electra.job import load_job

pytestmark = pytest.mark.paddle

def test_generator_and_discriminator_train_and_end_at_the_same_step(tmp_path: Path) -> None:
    gen, root = run_pair(settings_for(tmp_path, steps=40), MemoryBroker())
    assert gen.worker.step == root.worker.step == 40
    rtd = history(tmp_path, "disc-root", "rtd_loss")
    mlm = history(tmp_path, "gen", "mlm_loss")
    assert len(rtd) == len(mlm) == 40
    assert np.mean(rtd[-8:]) < np.mean(rtd[:8]) - 0.05, rtd
    assert np.mean(mlm[-8:]) < np.mean(mlm[:8]) - 0.3, mlm
    # The generator never ran more than max_lead steps ahead of the last sync token.
    synced = history(tmp_path, "gen", "synced")
    assert all(step - s <= 2 + 1 for step, s in enumerate(synced, start=1))
    for worker in ("gen", "disc-root"):
        latest = CheckpointStore(tmp_path / "checkpoints" / worker).latest()
        assert latest is not None and latest.step == 40
    from workers.electra.root import evaluate

    scores = evaluate(settings_for(tmp_path, steps=40))
    assert scores["gen_step"] == scores["disc_step"] == 40
    # Held-out sentences: the generator predicts masked tokens above chance (1/48 words);
    # after 40 tiny steps the detector has learnt the replacement prior (loss well below
    # ln 2) but not yet to beat "all original" in accuracy (nor does the 300-step small demo).
    assert scores["g0_heldout_mlm_acc"] > 2.5 / 48, scores
    assert scores["g0_heldout_rtd_loss"] < 0.5, scores


def test_stop_and_resume_ends_bit_identical_to_a_clean_run(tmp_path: Path) -> None:
    run_pair(settings_for(tmp_path / "a", steps=12), MemoryBroker())
    broker = MemoryBroker()
    c = settings_for(tmp_path / "c", steps=12)
    gen, root = run_pair(c, broker, stop_at=6)
    assert 6 <= gen.worker.step < 12 and 6 <= root.worker.step < 12
    run_pair(c, broker)
    for worker in ("gen", "disc-root"):
        clean = CheckpointStore(tmp_path / "a" / "checkpoints" / worker).latest()
        resumed = CheckpointStore(tmp_path / "c" / "checkpoints" / worker).latest()
        assert clean is not None and resumed is not None
        assert resumed.step == clean.step == 12 and resumed.digest == clean.digest


def test_the_generators_lead_changes_no_weight(tmp_path: Path) -> None:
    """A generator trains on its own data alone: in lockstep (max_lead 0) and eight steps
    ahead, both sides end bit-identical, so a lead deep enough for the WAN costs nothing."""
    for lead in (0, 8):
        run_pair(settings_for(tmp_path / str(lead), steps=12, max_lead=lead), MemoryBroker())
    synced = history(tmp_path / "8", "gen", "synced")
    assert max(step - s for step, s in enumerate(synced, start=1)) > 1  # it did run ahead
    for worker in ("gen", "disc-root"):
        lockstep = CheckpointStore(tmp_path / "0" / "checkpoints" / worker).latest()
        ahead = CheckpointStore(tmp_path / "8" / "checkpoints" / worker).latest()
        assert lockstep is not None and ahead is not None and lockstep.step == ahead.step == 12
        assert all(np.array_equal(lockstep.arrays[name], ahead.arrays[name]) for name in lockstep.arrays)
        assert lockstep.arrays.keys() == ahead.arrays.keys()


def test_m3_two_generators_with_their_own_tasks_feed_one_discriminator(tmp_path: Path) -> None:
    gen, root = run_pair(settings_for(tmp_path, steps=20, model={"preset": "tiny", **TWO_GENERATORS}),
                         MemoryBroker())
    assert gen.worker.step == root.worker.step == 20
    assert [t.task.task_id for t in gen.trainers] == ["mlm", "trtd"]
    # Both generators' micro-batches reached the discriminator: it saw 2 per step.
    assert root.trainer.step == 20
    rtd = history(tmp_path, "disc-root", "rtd_loss")
    assert np.mean(rtd[-5:]) < np.mean(rtd[:5])


def test_hot_start_continues_from_another_jobs_checkpoints(tmp_path: Path) -> None:
    first = settings_for(tmp_path / "inside", steps=10, generator_clusters=["cluster-b"])
    run_pair(first, MemoryBroker())
    second = settings_for(tmp_path / "across", steps=16, init_from=str(tmp_path / "inside"))
    gen, root = run_pair(second, MemoryBroker())
    assert gen.worker.step == root.worker.step == 16
    # Only the 6 new steps were trained in the second job.
    assert history(tmp_path / "across", "disc-root", "lr") and len(history(tmp_path / "across", "gen", "mlm_loss")) == 6


@given(t_g=st.floats(1e-3, 10.0), t_d=st.floats(1e-3, 10.0), cap=st.integers(1, 16))
def test_auto_n_balances_the_sides_within_bounds(t_g: float, t_d: float, cap: int) -> None:
    n = choose_n(t_g, t_d, cap)
    assert 1 <= n <= cap
    if 1 < n < cap:
        assert abs(n - t_d / t_g) <= 0.5 + 1e-9
    assert choose_n(t_g, t_d * 2, cap) >= n


def test_bad_sections_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_job(settings_for(tmp_path, 5, n_sub="many"))
    with pytest.raises(ConfigError):
        load_job(settings_for(tmp_path, 5, n_sub=0))
    with pytest.raises(ConfigError):
        flows(load_job(settings_for(tmp_path, 5, generator_clusters=["cluster-a", "cluster-c"])))
    with pytest.raises(ConfigError):
        load_job(settings_for(tmp_path, 5, bogus=1))


def test_auto_n_is_measured_once_and_every_process_reads_the_same_value(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, 5, n_sub="auto")
    n = load_job(settings).n
    record = json.loads((tmp_path / "electra-n-sub.json").read_text())
    assert 1 <= n <= 8 and record["n_sub"] == n
    assert n == choose_n(record["gen_s_per_micro_batch"], record["disc_s_per_micro_batch"])
    # Later processes (the ranks, the generator) read the recorded value instead of measuring.
    (tmp_path / "electra-n-sub.json").write_text(json.dumps({**record, "n_sub": 3}))
    assert load_job(settings).n == 3


@given(clusters=st.lists(st.sampled_from(["cluster-a", "cluster-b", "cluster-c"]), min_size=1, max_size=4),
       n_sub=st.integers(1, 4))
def test_m3_flows_give_each_generator_its_own_results_and_sync_streams(clusters: list[str], n_sub: int) -> None:
    from nebula_mq.topology import FlowKind
    from workers.electra.flows import electra_m3_flows

    fl = {f.name: f for f in electra_m3_flows(tuple(clusters), "cluster-b", n_sub)}
    assert len(fl) == 2 * len(clusters) + n_sub  # names unique within the job
    for k, cluster in enumerate(clusters):
        res, sync = fl[f"gen-results-{k}"], fl[f"sync-{k}"]
        assert (res.src_cluster, res.dst_cluster) == (cluster, "cluster-b")
        assert (sync.src_cluster, sync.dst_cluster, sync.kind) == ("cluster-b", cluster, FlowKind.SYNC)
    assert all(not fl[f"sub-disc-{r}"].crosses_clusters for r in range(n_sub))
