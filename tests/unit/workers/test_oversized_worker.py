"""A split head whose activation exceeds ``[transport] max_message_bytes`` stops with the typed,
one-line ``MessageTooLarge`` naming a codec that fits; nothing was published, so the tail applied
nothing and no checkpoint or ack covers a message that never existed."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nebula_mq import topology
from nebula_mq.errors import NebulaError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.transport.memory import MemoryBroker
from nebula_mq.wire.limits import MessageTooLarge
from tests.fixtures.pairs import run_split_pair, split_settings

pytestmark = pytest.mark.paddle


class Recording(MemoryBroker):
    """The in-memory broker, keeping the name of the queue of every message put on it."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[str] = []

    def put(self, name: str, message: Any) -> None:
        self.puts.append(name)
        super().put(name, message)


def test_a_head_sending_too_large_an_activation_stops_with_the_codec_that_fits(tmp_path: Path) -> None:
    base = split_settings(tmp_path, steps=4, forward="none")  # 32 x 32 float32 activations: 4 KiB raw
    settings = dataclasses.replace(base, transport=dataclasses.replace(base.transport, max_message_bytes=4096))
    broker = Recording()
    with pytest.raises(AssertionError) as info:
        run_split_pair(settings, broker)
    cause = info.value.__cause__
    assert "worker head-0 failed" in str(info.value)
    assert isinstance(cause, MessageTooLarge) and isinstance(cause, NebulaError)
    text = str(cause)  # what `nebula-mq worker` prints after "nebula-mq: error: ", as one line
    assert "\n" not in text
    assert text.startswith("flow 'activations' micro-batch 0: ") and "> max_message_bytes 4096 bytes; fp16 (" in text
    assert cause.fits and cause.fits[0].spec == "fp16"
    # Never published: no activation reached the broker, so the tail applied and acked nothing.
    activations = topology.queue_name(settings.job.id, "activations")
    assert activations not in broker.puts
    assert CheckpointStore(tmp_path / "checkpoints" / "tail-0").latest() is None
    # With the codec it names, the same job under the same limit trains.
    fits = dataclasses.replace(settings, codec=dataclasses.replace(settings.codec, forward=cause.fits[0].spec),
                               job=dataclasses.replace(settings.job, run_dir=str(tmp_path / "fits")))
    broker = Recording()
    head, tail = run_split_pair(fits, broker)
    assert head.worker.step == tail.worker.step == 4 and activations in broker.puts
