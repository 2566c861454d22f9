"""A worker's Prometheus series: who they belong to, and the depth of the queues it reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nebula_mq.codecs import Identity
from nebula_mq.runtime.channel import Inbox, Outbox
from nebula_mq.transport.memory import MemoryBroker
from nebula_mq.runtime.worker import Worker
from tests.fixtures.channels import FLOW


def test_every_series_names_its_worker_and_the_queues_it_reads_are_sampled(
        pair: tuple[Worker, Worker, MemoryBroker]) -> None:
    sender, receiver, _ = pair
    outbox = Outbox(sender, FLOW, "enc-0")
    for mb in range(3):
        outbox.send(step=mb, micro_batch=mb, tensors={"x": (np.ones(3, np.float32), Identity())})
    outbox.close()

    def body() -> int:
        Inbox(receiver, FLOW).close()  # the worker reads this queue
        receiver.record_step({"loss": 1.5})
        return 0

    assert receiver.lifecycle(body) == 0  # the sampler's last sample: the queues as it left them
    receiver.report.metrics.flush()
    assert receiver.report.metrics.textfile is not None
    samples = [s for f in text_string_to_metric_families(receiver.report.metrics.textfile.read_text()) for s in f.samples]
    assert samples and all({k: s.labels.get(k) for k in ("job", "worker", "role", "cluster")}
                           == {"job": "chan", "worker": "dec-0", "role": "test", "cluster": "t"} for s in samples)
    depth = {s.labels["queue"]: s.value for s in samples if s.name == "nebula_queue_messages"}
    queue = receiver.transport.queue_for(FLOW)
    assert depth == {queue: 3.0, receiver.transport.dead_letter_queue: 0.0}
    # Their size in bytes too, where the transport can say (the in-memory broker always can).
    size = {s.labels["queue"]: s.value for s in samples if s.name == "nebula_queue_bytes"}
    assert size[queue] == receiver.transport.queue_bytes(queue) > 3 * 12
    rows = [json.loads(line) for line in (receiver.settings.run_dir / "queues" / "dec-0.jsonl").read_text().splitlines()]
    assert {r["queue"]: r["bytes"] for r in rows}[queue] == size[queue]


def test_a_worker_logs_a_progress_line_with_rate_and_eta(pair: tuple[Worker, Worker, MemoryBroker],
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:

    from nebula_mq.runtime import reporter
    from nebula_mq.runtime.logs import configure_logging

    configure_logging("info", json=True)  # JSON lines on stderr, as in a worker process
    monkeypatch.setattr(reporter, "PROGRESS_LOG_S", 0.0)
    _, receiver, _ = pair
    for step in (1, 2, 3):
        receiver.step = step
        receiver.record_step({"loss": 4.0 - step})
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"progress"' in line]
    assert [r["step"] for r in lines] == [2, 3]  # the first step starts the clock
    assert lines[-1]["total"] == receiver.settings.job.steps and lines[-1]["loss"] == 1.0
    assert lines[-1]["steps_per_s"] > 0 and lines[-1]["eta_s"] >= 0


def test_a_dead_letter_queue_past_its_bound_raises_the_alarm_and_status_says_so(
        pair: tuple[Worker, Worker, MemoryBroker]) -> None:
    import dataclasses

    from nebula_mq.cli.status import dead_letter_alarms

    sender, receiver, _ = pair
    receiver.settings = dataclasses.replace(
        receiver.settings, transport=dataclasses.replace(receiver.settings.transport, dead_letter_alarm=2))
    receiver.report.settings = receiver.settings
    pub = sender.transport.publisher()
    for i in range(3):
        pub.publish(sender.transport.queue_for(FLOW), b"not an envelope", f"junk-{i}")
    pub.close()

    def body() -> int:
        inbox = Inbox(receiver, FLOW)
        assert inbox.get(timeout=0.3) is None  # all three dead-lettered
        inbox.close()
        return 0

    assert receiver.lifecycle(body) == 0  # the sampler's last sample finds them
    alarm = receiver.report.metrics.of(receiver.report.metrics.dead_letter_alarm)._value.get()
    assert alarm == 1.0
    receiver.report.dead_letters(receiver.transport.dead_letter_queue, 0)  # drained: the alarm falls
    assert receiver.report.metrics.of(receiver.report.metrics.dead_letter_alarm)._value.get() == 0.0
    queues = {"cluster-b": {"nebula.j.dead-letter": {"messages": 3, "bytes": 90},
                            "nebula.j.activations": {"messages": 50, "bytes": 9}},
              "cluster-a": {"nebula.j.dead-letter": {"messages": 2, "bytes": 60}}}
    lines = dead_letter_alarms(queues, bound=2)
    assert len(lines) == 1 and lines[0].startswith("ALARM: cluster-b/nebula.j.dead-letter holds 3 dead letters")


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard event records (length, crc, Event proto, crc), decoded with tensorboardX's protos."""
    import struct

    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_each_workers_values_are_tensorboard_scalars(pair: tuple[Worker, Worker, MemoryBroker]) -> None:
    _, receiver, _ = pair
    for step in (1, 2, 3):
        receiver.step = step
        receiver.record_step({"loss": 4.0 - step, "lr": 1e-3, "acc": float("nan")})
    receiver.hooks.close()  # as Worker.main does on its way out
    scalars = read_scalars(receiver.settings.run_dir / "tensorboard" / "dec-0")
    assert scalars["loss"] == [(1, 3.0), (2, 2.0), (3, 1.0)]
    assert [s for s, _ in scalars["lr"]] == [1, 2, 3] and "acc" not in scalars  # NaN is not plotted


def test_the_tensorboard_hook_leaves_torch_unloaded_and_importable(tmp_path: Path) -> None:
    """tensorboardX's writer would import torch (installed here) at every worker start, 2 s of
    CPU a Paddle worker does not need: the hook keeps it out, and a model can still import it."""
    import subprocess
    import sys

    script = f"""
import sys
from nebula_mq.runtime.tracking import TensorBoardHook
hook = TensorBoardHook({str(tmp_path)!r})
hook.on_step(1, {{"loss": 2.5}})
hook.close()
assert "torch" not in sys.modules, "tensorboardX imported torch"
import torch
print(torch.ones(2).sum().item())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "2.0"
    assert read_scalars(tmp_path)["loss"] == [(1, 2.5)]
