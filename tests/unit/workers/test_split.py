"""The generic split-model workers (workers/split*.py) over the in-memory transport,
on the worked example examples/split_mlp (a user's MLP cut in two)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from nebula_mq import topology
from nebula_mq.errors import ConfigError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.settings import JobSettings, Settings, load_settings
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport
from tests.fixtures.pairs import drivers, memory_worker, SPLIT_EXAMPLE as EXAMPLE
from tests.fixtures.pairs import assert_resume_matches_clean
from tests.fixtures.pairs import run_split_pair as run_pair
from tests.fixtures.pairs import split_settings as settings_for
from tests.fixtures.threads import history, run_workers

pytestmark = pytest.mark.paddle

sys.path.insert(0, str(EXAMPLE))  # the example's `mlp` module, as its scripts import it


def losses(run_dir: Path, worker: str) -> list[float]:
    return history(run_dir, worker, "loss")


def test_example_trains_compressed_with_two_in_flight(tmp_path: Path) -> None:
    head, tail = run_pair(settings_for(tmp_path, steps=60), MemoryBroker())
    assert head.worker.step == tail.worker.step == 60
    curve = losses(tmp_path, "tail-0")
    assert len(curve) == 60
    assert np.mean(curve[-10:]) < 0.5 * np.mean(curve[:10])
    assert losses(tmp_path, "head-0") == curve  # the head saw the same losses in the replies
    for worker in ("head-0", "tail-0"):
        assert CheckpointStore(tmp_path / "checkpoints" / worker).latest().step == 60  # type: ignore[union-attr]


def test_uncompressed_lockstep_split_equals_joint_training(tmp_path: Path) -> None:
    import mlp
    import paddle

    run_pair(settings_for(tmp_path, steps=12, in_flight=1, forward="none", backward="none"), MemoryBroker())
    split = losses(tmp_path, "tail-0")

    x, y = mlp.dataset()
    joint = paddle.nn.Sequential(mlp.bottom(), mlp.top())
    opt = paddle.optimizer.Adam(learning_rate=0.003, parameters=joint.parameters())
    expected = []
    for mb in range(12):
        ids = mlp.batch_ids(mb)
        loss = paddle.nn.functional.mse_loss(joint(paddle.to_tensor(x[ids])), paddle.to_tensor(y[ids]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        expected.append(float(loss))
    np.testing.assert_allclose(split, expected, rtol=1e-5)
    assert expected[-1] < expected[0]


def test_striped_flows_spread_the_micro_batches_and_train_bit_identically_to_one_queue(tmp_path: Path) -> None:
    """Three queues per flow (``[split] stripes``): micro-batch i travels on stripe i % 3, in both
    directions, and the receivers restore the order, so the run is the one-queue run, bit for bit."""
    run_pair(settings_for(tmp_path / "one", steps=12), MemoryBroker())
    run_pair(settings_for(tmp_path / "three", steps=12, stripes=3), MemoryBroker())
    assert losses(tmp_path / "three", "tail-0") == losses(tmp_path / "one", "tail-0")
    for worker in ("head-0", "tail-0"):
        one, three = (CheckpointStore(d / "checkpoints" / worker).latest() for d in (tmp_path / "one", tmp_path / "three"))
        assert one is not None and three is not None and one.digest == three.digest, worker
    sent = (tmp_path / "three" / "metrics" / "head-0.prom").read_text()
    received = (tmp_path / "three" / "metrics" / "tail-0.prom").read_text()
    for stripe in ("activations", "activations-s1", "activations-s2"):
        assert f'flow="{stripe}"' in sent and f'flow="{stripe}"' in received, stripe
    reply = topology.reply_flow("head-0")
    for stripe in (reply, f"{reply}-s1", f"{reply}-s2"):  # the gradients come back striped too
        assert f'flow="{stripe}"' in received and f'flow="{stripe}"' in sent, stripe


def test_both_sides_on_one_cluster_train_bit_identically_to_two_clusters(tmp_path: Path) -> None:
    """The in-cluster baseline (head_cluster == tail_cluster: every flow local to one broker)
    trains the same model as the cross-cluster job, bit for bit."""
    from workers.split.head import SpecHead
    from workers.split.tail import SpecTail

    import mlp

    run_pair(settings_for(tmp_path / "two", steps=12), MemoryBroker())
    one = settings_for(tmp_path / "one", steps=12)
    one = Settings(job=one.job, codec=one.codec, transport=one.transport,
                   split={**one.section("split"), "tail_cluster": "s"})
    broker = MemoryBroker()
    tail = SpecTail(one, mlp.build_tail(one), memory_worker(SpecTail.identity(one), broker))
    head = SpecHead(one, mlp.build_head(one), memory_worker(SpecHead.identity(one), broker))
    assert not any(f.crosses_clusters for f in (*head.act_flows, *head.reply_flows))
    run_workers(drivers(tail, head))
    for worker in ("head-0", "tail-0"):
        a, b = (CheckpointStore(d / "checkpoints" / worker).latest() for d in (tmp_path / "two", tmp_path / "one"))
        assert a is not None and b is not None and a.step == b.step == 12 and a.digest == b.digest, worker


def test_stop_and_resume_is_bit_identical(tmp_path: Path) -> None:
    assert_resume_matches_clean(lambda d: settings_for(d, steps=12), run_pair, tmp_path, ("head-0", "tail-0"))


def test_the_example_job_file_plans_both_roles_and_names_importable_builders(tmp_path: Path) -> None:
    from workers.plans import plan_for
    from workers.split.job import HeadSpec, TailSpec, load_spec

    settings = load_settings(EXAMPLE / "job.toml")
    plan = plan_for(settings)
    assert {(p.role, p.cluster) for p in plan.processes} == {("split-head", "cluster-a"), ("split-tail", "cluster-b")}
    assert [f.name for f in plan.flows][0] == "activations"
    assert isinstance(load_spec(settings, "head"), HeadSpec)
    assert isinstance(load_spec(settings, "tail"), TailSpec)


@pytest.mark.parametrize("target", ["", "nomodule", "no_such_module_xyz:build", "mlp:no_such_function"])
def test_a_bad_builder_name_is_a_config_error(tmp_path: Path, target: str) -> None:
    from workers.split.job import load_spec

    settings = settings_for(tmp_path, steps=1)
    settings = Settings(job=settings.job, split={"head": target}, source=str(EXAMPLE / "job.toml"))
    with pytest.raises(ConfigError, match="split.head"):
        load_spec(settings, "head")


def test_bad_split_section_is_a_config_error(tmp_path: Path) -> None:
    from workers.split.job import load_split_job

    for bad in ({"in_flight": 0}, {"stripes": 0}, {"lr": "fast"}):
        with pytest.raises(ConfigError):
            load_split_job(Settings(job=JobSettings(id="x", scenario="split"), split=bad))


def test_the_few_lines_api_runs_the_example_job_file(tmp_path: Path) -> None:
    """run_head/run_tail as examples/split_mlp/head.py and tail.py call them, on the
    example's own job.toml (brokers swapped for the in-memory transport)."""
    import dataclasses

    import mlp
    from paddle.nn.functional import mse_loss

    from nebula_mq.security.keys import ensure_job_key, job_key_file
    from workers.split import run_head, run_tail

    loaded = load_settings(EXAMPLE / "job.toml")
    settings = dataclasses.replace(loaded, job=dataclasses.replace(loaded.job, steps=40, run_dir=str(tmp_path)))
    # Both sides share the job's HMAC key, installed beforehand (as `nebula-mq run` does).
    ensure_job_key(job_key_file(settings.run_dir), settings.job.id)
    broker = MemoryBroker()
    x, y = mlp.dataset()
    codes: dict[str, int] = {}

    def transport(cluster: str) -> MemoryTransport:
        return MemoryTransport(broker, settings.transport, settings.job.id, cluster)

    tail = threading.Thread(target=lambda: codes.update(tail=run_tail(
        settings, model=mlp.top(), loss=mse_loss, targets=lambda ids: y[ids], transport=transport("cluster-b"))))
    head = threading.Thread(target=lambda: codes.update(head=run_head(
        settings, model=mlp.bottom(), inputs=lambda mb: (ids := mlp.batch_ids(mb), x[ids]),
        transport=transport("cluster-a"))))
    for t in (tail, head):
        t.start()
    for t in (tail, head):
        t.join(120)
    assert codes == {"tail": 0, "head": 0}
    curve = losses(tmp_path, "tail-0")
    assert len(curve) == 40 and np.mean(curve[-8:]) < 0.5 * np.mean(curve[:8])


def test_a_worker_that_dies_fails_the_run_at_once_and_leaves_no_thread_waiting(tmp_path: Path) -> None:
    """Its peer would otherwise wait for ever for the next activation (issue 13, finding 1)."""
    import mlp

    from workers.split.head import SpecHead
    from workers.split.tail import SpecTail
    from workers.split.job import HeadSpec

    settings = settings_for(tmp_path, steps=50)
    broker = MemoryBroker()
    x, _ = mlp.dataset()

    def inputs(mb: int) -> tuple[np.ndarray, np.ndarray]:
        if mb == 4:
            raise RuntimeError("the data loader broke at micro-batch 4")
        ids = mlp.batch_ids(mb)
        return ids, x[ids]

    tail = SpecTail(settings, mlp.build_tail(settings),  # type: ignore[arg-type]
                    memory_worker(SpecTail.identity(settings), broker))
    head = SpecHead(settings, HeadSpec(model=mlp.bottom(), inputs=inputs),
                    memory_worker(SpecHead.identity(settings), broker))
    before = set(threading.enumerate())
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="head-0 failed.*micro-batch 4"):
        run_workers(drivers(tail, head), timeout=60)
    assert time.monotonic() - t0 < 20
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_the_head_applies_only_replies_that_correlate_with_its_request(tmp_path: Path) -> None:
    """Request/reply by correlation id (aio-pika's RPC pattern): a gradient is applied only when its
    correlation id is the id of the activation the head sent for that micro-batch."""
    import types

    import mlp

    from nebula_mq import topology
    from nebula_mq.errors import MalformedMessage
    from nebula_mq.runtime.channel import Received
    from nebula_mq.wire import Envelope
    from workers.split.head import SpecHead

    settings = settings_for(tmp_path, steps=4)
    head = SpecHead(settings, mlp.build_head(settings),  # type: ignore[arg-type]
                    memory_worker(SpecHead.identity(settings), MemoryBroker()))

    def reply(mb: int, correlation_id: str | None) -> Received:
        env = Envelope(settings.job.id, head.reply_flow.name, mb, mb, mb, "tail-0", ())
        return Received(env, {}, types.SimpleNamespace(correlation_id=correlation_id))  # type: ignore[arg-type]

    asked = topology.message_id(settings.job.id, head.act_flows[0].name, "head-0", 3)
    head.check_correlation(reply(3, asked))  # the answer to micro-batch 3's activation
    for wrong in (None, topology.message_id(settings.job.id, head.act_flows[0].name, "head-0", 2)):
        with pytest.raises(MalformedMessage, match="correlates"):
            head.check_correlation(reply(3, wrong))


def test_the_tail_replies_before_its_optimizer_step(tmp_path: Path) -> None:
    """The gradient of a micro-batch's activation is final once backward is done: it leaves then,
    and the optimizer step (with a tail group's all-reduce) runs while it crosses, outside the
    loop that ``in_flight`` must span."""
    from nebula_mq.runtime.hooks import Hook, MessageEvent
    from workers.split.head import SpecHead
    from workers.split.tail import SpecTail

    import mlp

    settings = settings_for(tmp_path, steps=6)
    broker = MemoryBroker()
    tail = SpecTail(settings, mlp.build_tail(settings), memory_worker(SpecTail.identity(settings), broker))
    head = SpecHead(settings, mlp.build_head(settings), memory_worker(SpecHead.identity(settings), broker))
    replied: list[int] = []
    replied_before_step: list[list[int]] = []

    class Replies(Hook):
        def on_published(self, event: MessageEvent) -> None:
            replied.append(event.micro_batch)

    tail.worker.hooks.add(Replies())
    step_optimizer = tail.step_optimizer

    def recording_step() -> None:
        replied_before_step.append(list(replied))
        step_optimizer()

    tail.step_optimizer = recording_step  # type: ignore[method-assign]
    run_workers(drivers(tail, head))
    assert replied == list(range(6))
    assert replied_before_step == [list(range(s + 1)) for s in range(6)]


def test_a_script_whose_job_names_no_stack_ends_with_one_line_and_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_head`` in a user's script: no broker table and no stack here is one line naming the
    side and what to do, not a traceback."""
    from tests.fixtures.jobs import split_job
    from workers.split import run_head

    monkeypatch.setenv("NEBULA_RUN_DIR", str(tmp_path / "no-stack"))
    job = tmp_path / "job.toml"
    job.write_text(split_job("script", tmp_path / "run", steps=4))
    assert run_head(job, model=object(), inputs=lambda mb: ([], [])) == 1
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line == (f"nebula-mq: error: head-0 (cluster-a): no stack in {(tmp_path / 'no-stack').resolve()} "
                    "(run `nebula-mq stack up` first)"), line
    assert not (tmp_path / "run" / "status").exists()
