"""M3 with a process per generator (paper Figure 4), over the in-memory transport in threads.

Generator 0 (multilingual MLM) on cluster-a and generator 1 (translation pairs)
on cluster-c, each its own worker on its own ``gen-results-<k>`` / ``sync-<k>``
flows, feed one root discriminator on cluster-b. Real brokers:
tests/integration/test_electra_m3_e2e.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.security.roles import permissions
from nebula_mq.settings import Settings
from nebula_mq.topology import flow_exchange, queue_name
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport
from tests.fixtures.threads import history, run_workers
from tests.fixtures.pairs import TWO_GENERATORS, drivers
from tests.fixtures.pairs import electra_settings as settings_for
from workers.electra.job import load_job

pytestmark = pytest.mark.paddle

M3 = {"model": {"preset": "tiny", **TWO_GENERATORS}, "generator_clusters": ["cluster-a", "cluster-c"]}


def m3_settings(run_dir: Path, steps: int, **electra: Any) -> Settings:
    return settings_for(run_dir, steps, **{**M3, **electra})


def run_m3(settings: Settings, broker: MemoryBroker, stop_at: int | None = None) -> list[Any]:
    """The roles root, gen-0 and gen-1, each with a transport on its own cluster."""
    from workers.electra.generator import ElectraGenerator
    from workers.electra.root import ElectraRoot

    job = load_job(settings)

    def transport(cluster: str) -> MemoryTransport:
        return MemoryTransport(broker, settings.transport, settings.job.id, cluster)

    roles: list[Any] = [ElectraRoot(settings, ElectraRoot.identity(settings, 0).worker(transport(job.disc_cluster)))]
    roles += [ElectraGenerator(settings, ElectraGenerator.identity(settings, k).worker(transport(job.cluster_of(k))), k) for k in (0, 1)]
    run_workers(drivers(*roles), stop_at)
    return roles


def model_arrays(run_dir: Path, worker: str) -> dict[str, np.ndarray]:
    ck = CheckpointStore(run_dir / "checkpoints" / worker).latest()
    assert ck is not None, worker
    return {k: np.asarray(v) for k, v in ck.arrays.items()}


def test_generators_in_their_own_processes_on_their_own_clusters_feed_one_discriminator(tmp_path: Path) -> None:
    root, gen0, gen1 = run_m3(m3_settings(tmp_path, steps=20), MemoryBroker())
    assert ((gen0.worker.worker_id, gen0.worker.cluster, gen1.worker.worker_id, gen1.worker.cluster)
            == ("gen-0", "cluster-a", "gen-1", "cluster-c"))
    assert root.worker.step == gen0.worker.step == gen1.worker.step == 20
    assert [t.task.task_id for t in gen0.trainers + gen1.trainers] == ["mlm", "trtd"]
    rtd = history(tmp_path, "disc-root", "rtd_loss")
    assert len(rtd) == 20 and np.mean(rtd[-5:]) < np.mean(rtd[:5]) - 0.05, rtd
    for worker in ("gen-0", "gen-1"):
        mlm = history(tmp_path, worker, "mlm_loss")
        assert len(mlm) == 20 and np.mean(mlm[-5:]) < np.mean(mlm[:5]), (worker, mlm)
        # Each generator waited for its own sync tokens: never more than max_lead ahead.
        synced = history(tmp_path, worker, "synced")
        assert all(step - s <= 2 + 1 for step, s in enumerate(synced, start=1))
    # Each process checkpoints only the generator it hosts.
    assert {k.split("/")[0] for k in model_arrays(tmp_path, "gen-0")} == {"g0"}
    assert {k.split("/")[0] for k in model_arrays(tmp_path, "gen-1")} == {"g1"}
    from workers.electra.root import evaluate

    scores = evaluate(m3_settings(tmp_path, steps=20))
    assert scores["gen_step"] == scores["disc_step"] == 20
    assert {"g0_heldout_mlm_acc", "g1_heldout_mlm_acc", "g1_heldout_rtd_loss"} <= set(scores)


def test_a_process_per_generator_computes_what_one_process_hosting_both_computes(tmp_path: Path) -> None:
    """Same seeds, same micro-batches, same concatenation order at the root: the
    layout changes where generators run, not a single bit of what is trained."""
    from tests.fixtures.pairs import run_electra_pair as run_pair

    run_pair(settings_for(tmp_path / "one", steps=8, model=M3["model"]), MemoryBroker())
    run_m3(m3_settings(tmp_path / "three", steps=8), MemoryBroker())
    single = model_arrays(tmp_path / "one", "gen")
    for k in (0, 1):
        own = model_arrays(tmp_path / "three", f"gen-{k}")
        assert own.keys() == {a for a in single if a.startswith(f"g{k}/")}
        for name, value in own.items():
            np.testing.assert_array_equal(value, single[name], err_msg=name)
    one, three = model_arrays(tmp_path / "one", "disc-root"), model_arrays(tmp_path / "three", "disc-root")
    assert one.keys() == three.keys()
    for name in one:
        np.testing.assert_array_equal(one[name], three[name], err_msg=name)


def test_stop_and_resume_of_every_process_ends_bit_identical(tmp_path: Path) -> None:
    run_m3(m3_settings(tmp_path / "clean", steps=12), MemoryBroker())
    broker, resumed = MemoryBroker(), m3_settings(tmp_path / "resumed", steps=12)
    stopped = run_m3(resumed, broker, stop_at=6)
    assert all(6 <= r.worker.step < 12 for r in stopped)
    run_m3(resumed, broker)  # same broker: unacked micro-batches and sync tokens are still queued
    for worker in ("gen-0", "gen-1", "disc-root"):
        clean = CheckpointStore(tmp_path / "clean" / "checkpoints" / worker).latest()
        again = CheckpointStore(tmp_path / "resumed" / "checkpoints" / worker).latest()
        assert clean is not None and again is not None
        assert again.step == clean.step == 12 and again.digest == clean.digest, worker


def test_hot_start_from_one_generator_process_into_a_process_per_generator(tmp_path: Path) -> None:
    """Train inside one cluster with both generators in one process, resume with each
    generator on its own cluster (the paper's inside-then-across, with M3)."""
    from tests.fixtures.pairs import run_electra_pair as run_pair

    run_pair(settings_for(tmp_path / "inside", steps=6, model=M3["model"], generator_clusters=["cluster-b"]),
             MemoryBroker())
    roles = run_m3(m3_settings(tmp_path / "across", steps=10, init_from=str(tmp_path / "inside")), MemoryBroker())
    assert [r.worker.step for r in roles] == [10, 10, 10]
    assert len(history(tmp_path / "across", "gen-1", "mlm_loss")) == 4  # only the new steps


def _allows(regex: str, name: str) -> bool:
    return re.fullmatch(regex, name) is not None


def test_each_generator_identity_reaches_only_its_own_flows(tmp_path: Path) -> None:
    from workers.plans import plan_for

    settings = m3_settings(tmp_path, steps=5, n_sub=2)
    plan = plan_for(settings)
    by_id = {p.worker_id: p for p in plan.processes}
    assert sorted(by_id) == ["disc-root", "disc-sub-1", "gen-0", "gen-1"]
    assert (by_id["gen-0"].cluster, by_id["gen-1"].cluster, by_id["gen-1"].index) == ("cluster-a", "cluster-c", 1)
    job = "m3"
    ids = plan.identities(job)
    assert set(ids) == {"cluster-a", "cluster-b", "cluster-c"}
    for k, other in ((0, 1), (1, 0)):
        perm = permissions(job, by_id[f"gen-{k}"].broker_identity(job), plan.flows)
        assert _allows(perm.write, flow_exchange(job, f"gen-results-{k}"))
        assert not _allows(perm.write, flow_exchange(job, f"gen-results-{other}"))
        assert _allows(perm.read, queue_name(job, f"sync-{k}"))
        assert not _allows(perm.read, queue_name(job, f"sync-{other}"))
    root = permissions(job, by_id["disc-root"].broker_identity(job), plan.flows)
    for k in (0, 1):
        assert _allows(root.read, queue_name(job, f"gen-results-{k}"))
        assert _allows(root.write, flow_exchange(job, f"sync-{k}"))
    assert not _allows(root.write, flow_exchange(job, "gen-results-0"))
