"""Every role type is a plain object given its worker: built here with an in-memory transport
and a key held in memory, no broker and no key file, and asked what its steps read."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from nebula_mq.runtime.driver import Extras
from nebula_mq.runtime.worker import Worker
from nebula_mq.security.auth import MessageAuth
from nebula_mq.security.keys import JobKey, KeyRing
from nebula_mq.settings import Settings
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import SPLIT_EXAMPLE, abnet_settings, electra_settings, memory_worker, split_settings
from tests.fixtures.replicas import settings_for as replicas_settings
from workers.base import WorkerIdentity

sys.path.insert(0, str(SPLIT_EXAMPLE))  # the example's `mlp` and `mlp_replicas` modules


def given(identity: WorkerIdentity, broker: MemoryBroker) -> Worker:
    """The worker of ``identity`` over ``broker``, signing with a key that lives in memory."""
    ring = KeyRing(identity.settings.job.id, 0, (JobKey(b"k" * 8, b"s" * 32, 0),))
    return memory_worker(identity, broker, MessageAuth(ring, consumer=identity.worker_id))


def no_key_file_and_nothing_declared(settings: Settings, broker: MemoryBroker) -> None:
    assert not (settings.run_dir / "keys").exists()
    assert not broker.queues  # built, not opened: nothing asked of a broker yet


def test_the_split_head_and_tail_read_each_others_flow(tmp_path: Path) -> None:
    import mlp

    from workers.split.head import SpecHead
    from workers.split.tail import SpecTail

    settings, broker = split_settings(tmp_path, steps=4), MemoryBroker()
    head_worker = given(SpecHead.identity(settings), broker)
    tail_worker = given(SpecTail.identity(settings), broker)
    head = SpecHead(settings, mlp.build_head(settings), head_worker)  # type: ignore[arg-type]
    tail = SpecTail(settings, mlp.build_tail(settings), tail_worker)  # type: ignore[arg-type]

    assert (head.worker, tail.worker) == (head_worker, tail_worker)
    assert (head_worker.worker_id, head_worker.cluster, tail_worker.cluster) == ("head-0", "s", "t")
    assert head.inputs().flows == (head.reply_flows[0],) and head.inputs().sources == ()
    assert tail.inputs().flows == (head.act_flows[0],) and tail.inputs().sources == ()
    assert head.extras().unsaved == head.unsaved and head.extras().resume_store is None
    assert tail.extras().admit == tail.check_reply_to
    no_key_file_and_nothing_declared(settings, broker)


def test_the_abnet_encoder_and_decoder_read_each_others_flow(tmp_path: Path) -> None:
    from workers.abnet.decoder import AbnetDecoder
    from workers.abnet.encoder import AbnetEncoder

    settings, broker = abnet_settings(tmp_path, steps=4), MemoryBroker()
    encoder = AbnetEncoder(settings, given(AbnetEncoder.identity(settings), broker))
    decoder = AbnetDecoder(settings, given(AbnetDecoder.identity(settings), broker))

    assert (encoder.worker.role, decoder.worker.role) == ("abnet-encoder", "abnet-decoder")
    assert encoder.inputs().flows == (encoder.reply_flows[0],)
    assert decoder.inputs().flows == (encoder.act_flows[0],)
    assert encoder.extras().after_training == encoder.after_training
    assert decoder.extras().more_to_do == decoder.more_to_do
    assert decoder.extras().admit == decoder.check_reply_to  # the tail's, kept
    no_key_file_and_nothing_declared(settings, broker)


def test_the_electra_generator_root_and_sub_read_their_streams(tmp_path: Path) -> None:
    from workers.electra.generator import ElectraGenerator
    from workers.electra.root import ElectraRoot
    from workers.electra.sub import ElectraSub

    settings, broker = electra_settings(tmp_path, steps=4, n_sub=2), MemoryBroker()
    gen = ElectraGenerator(settings, given(ElectraGenerator.identity(settings), broker))
    root = ElectraRoot(settings, given(ElectraRoot.identity(settings, 0), broker))
    sub = ElectraSub(settings, given(ElectraSub.identity(settings, 1), broker), 1)

    assert [r.worker.worker_id for r in (gen, root, sub)] == ["gen", "disc-root", "disc-sub-1"]
    assert gen.inputs().flows == (gen.sync_flow,) and gen.inputs().per_step == 1
    # The root reads each generator's stream, n_sub shares of it a step; the sub its own share.
    assert root.inputs().sources == ("gen-0",) and root.inputs().per_step == 2
    assert tuple(root.inputs().flows) == (gen.results_flow,)
    assert sub.inputs().flows == (root.sub_flows[0],) and sub.inputs().per_step == 1
    assert root.extras().admit == root.check_share and root.extras().resume_store == root.resume_store
    assert gen.extras().unsaved == gen.unsaved
    no_key_file_and_nothing_declared(settings, broker)


def test_a_replica_reads_every_other_clusters_pseudo_gradient(tmp_path: Path) -> None:
    from mlp_replicas import build_replica

    from workers.replicas.replica import Replica, replica_role

    settings, broker = replicas_settings(tmp_path, steps=2), MemoryBroker()
    replicas = [replica_role(settings, build_replica(settings, c), c, given(Replica.identity(settings, c), broker))
                for c in range(3)]

    assert [r.worker.cluster for r in replicas] == ["cluster-a", "cluster-b", "cluster-c"]
    first = replicas[0].inputs()
    assert first.sources == tuple(r.worker.worker_id for r in replicas[1:])
    assert {f.src_cluster for f in first.flows} == {"cluster-b", "cluster-c"}
    extras: Any = replicas[0].extras()
    assert isinstance(extras, Extras) and extras.members == replicas[0].members
    no_key_file_and_nothing_declared(settings, broker)


def test_a_rank_outside_the_job_is_refused_before_any_worker_exists(tmp_path: Path) -> None:
    from nebula_mq.errors import WorkerError
    from workers.replicas.replica import Replica
    from workers.split.head import SpecHead

    with pytest.raises(WorkerError, match="head rank 1 outside 0..0"):
        SpecHead.identity(split_settings(tmp_path, steps=4), 1)
    with pytest.raises(WorkerError, match="replica 3 outside 0..2"):
        Replica.identity(replicas_settings(tmp_path, steps=2), 3)
