"""examples/split_langid/langid_replicas.py (the langid transformer as one whole model, for a
replicas job) on a tiny in-memory set of strings: identical initial weights on every cluster,
disjoint deterministic shards, the shipped job file, and two replicas trained by streaming
DiLoCo over the in-memory transport that agree on their outer weights, lower their loss and
whose last checkpoint evaluate.py scores above the baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nebula_mq.settings import Settings
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import drivers, memory_worker
from tests.fixtures.replicas import Rounds, hooks_of, job_text
from tests.fixtures.threads import history, run_workers
from workers.registry import load_job_settings
from workers.replicas.job import ReplicaSpec, load_job
from workers.replicas.spec import load_spec

torch = pytest.importorskip("torch")
from tests.fixtures.langid import EXAMPLE, WORDS, evaluate  # noqa: E402  (after torch)
import langid_data  # noqa: E402
import langid_replicas  # noqa: E402

@pytest.fixture(scope="module")
def data() -> langid_data.LangData:
    """Strings of three or four words per language: 32 training strings each, 8 held out."""
    rng = np.random.default_rng(0)
    texts = {lang: [" ".join(rng.choice(words, size=3 + i % 2)) for i in range(48)] for lang, words in WORDS.items()}
    return langid_data.split(texts, per_language=32, held_out=8)


def job_settings(tmp_path: Path, rounds: int = 2) -> tuple[Path, Settings]:
    job = tmp_path / "replicas.toml"
    job.write_text(job_text("unit-langid-replicas", tmp_path / "run", 2 * rounds,  # two fragments: 2 events a round
                            inner_lr=0.01, codec="int8", error_feedback=True, fragments=2, overlap_steps=1,
                            model="langid_replicas:build_replica", framework="torch", checkpoint_every=4))
    return job, load_job_settings(job)


def test_every_replica_builds_the_same_weights_and_its_own_deterministic_shard(
        tmp_path: Path, data: langid_data.LangData) -> None:
    _, settings = job_settings(tmp_path)
    specs = [langid_replicas.build_replica(settings, c, data) for c in (0, 1)]
    torch.manual_seed(123)  # the global generator's state must not matter: the builders seed
    again = langid_replicas.build_replica(settings, 1, data)
    first = specs[0].model.state_dict()
    for spec in (specs[1], again):
        other = spec.model.state_dict()
        assert list(other) == list(first)
        assert all(torch.equal(first[k], other[k]) for k in first)
    # A training string's row is its id: the strings are distinct.
    row_id = {bytes(row.astype(np.uint8)): i for i, row in enumerate(data.train_bytes)}
    assert len(row_id) == len(data.train_labels)
    seen: list[set[int]] = [set(), set()]
    for shard, spec in enumerate(specs):
        for step in range(6):
            (x,), (y,) = spec.batch(shard, step)
            assert x.shape == (langid_data.BATCH, langid_data.MAX_BYTES) and y.shape == (langid_data.BATCH,)
            assert x.dtype == y.dtype == np.int64
            ids = [row_id[bytes(row.astype(np.uint8))] for row in x]
            assert all(i % 2 == shard for i in ids) and np.array_equal(y, data.train_labels[ids])
            (x2,), (y2,) = again.batch(shard, step)  # another process's spec draws the same
            assert np.array_equal(x, x2) and np.array_equal(y, y2)
            seen[shard].update(ids)
        assert not np.array_equal(spec.batch(shard, 0)[0][0], spec.batch(shard, 1)[0][0])
    assert seen[0].isdisjoint(seen[1])


def test_the_shipped_job_is_streaming_diloco_on_two_clusters_and_finds_its_model(
        monkeypatch: pytest.MonkeyPatch, data: langid_data.LangData) -> None:
    monkeypatch.setattr(langid_data, "dataset", lambda: data)  # not the host's catalogues
    settings = load_job_settings(EXAMPLE / "replicas.toml")
    job = load_job(settings)
    assert job.clusters == ("cluster-a", "cluster-b") and job.codec == "int8" and job.error_feedback
    assert job.fragments == 2 and 0 < job.overlap_steps <= job.inner_steps // job.fragments
    spec = load_spec(settings, 1)
    assert isinstance(spec.model, torch.nn.Module)


def run_two(settings: Settings, data: langid_data.LangData) -> list[Any]:
    """Both replicas, each in its own thread over one in-memory broker (built here rather than
    by tests.fixtures.replicas.build, which imports the Paddle example)."""
    from workers.replicas.replica import Replica, replica_role

    broker = MemoryBroker()
    job = load_job(settings)
    roles = []
    for c, cluster in enumerate(job.clusters):
        spec: ReplicaSpec = langid_replicas.build_replica(settings, c, data)
        worker = memory_worker(Replica.identity(settings, c), broker)
        roles.append(replica_role(settings, spec, c, worker))
        roles[-1].worker.hooks.add(Rounds(roles[-1]))
    run_workers(drivers(*roles))
    return roles


def test_two_replicas_agree_on_their_outer_weights_learn_and_evaluate_scores_them(
        tmp_path: Path, data: langid_data.LangData, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    rounds = 6
    job, settings = job_settings(tmp_path, rounds)
    roles = run_two(settings, data)
    events = rounds * 2  # two fragments: two sync events a round
    assert [r.worker.step for r in roles] == [events] * 2 and [r.trainer.trained for r in roles] == [rounds * 4] * 2
    assert hooks_of(roles[0]).outer == hooks_of(roles[1]).outer  # after every event, bit for bit
    first, second = (r.trainer.start for r in roles)
    assert sorted(first) == sorted(second) and all(np.array_equal(first[k], second[k]) for k in first)
    for c in (0, 1):
        curve = history(tmp_path / "run", f"replica-{c}")
        assert len(curve) == events and np.mean(curve[-3:]) < 0.7 * np.mean(curve[:3]), curve
        sent = history(tmp_path / "run", f"replica-{c}", "sent_bytes")
        raw = history(tmp_path / "run", f"replica-{c}", "raw_bytes")
        assert all(0 < s < 0.3 * w for s, w in zip(sent, raw))  # int8: about a quarter of float32
    monkeypatch.setattr(evaluate, "dataset", lambda: data)
    capsys.readouterr()  # not the run's log lines
    assert evaluate.main([str(job)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and f"after {rounds} rounds" in out and "baseline 0.333" in out
    assert float(out.split("held-out accuracy ")[1].split()[0]) > 0.5


def test_evaluate_without_a_checkpoint_is_one_line(tmp_path: Path, data: langid_data.LangData,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    job, _ = job_settings(tmp_path)
    monkeypatch.setattr(evaluate, "dataset", lambda: data)
    assert evaluate.main([str(job)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("evaluate: ") and "no checkpoint under" in err and err.count("\n") == 1
