"""An envelope above ``[transport] max_message_bytes`` is refused by ``Outbox.send`` before it is
published (nothing reaches the queue, nothing is counted as sent); a job whose limit exceeds the
brokers' max_message_size is refused at load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from nebula_mq.codecs import FP16, Identity
from nebula_mq.errors import ConfigError, OversizedMessage
from nebula_mq.runtime.channel import Inbox, Outbox
from nebula_mq.runtime.hooks import Hook, MessageEvent
from nebula_mq.runtime.worker import Worker
from nebula_mq.settings import BROKER_MAX_MESSAGE_BYTES, TransportSettings, load_settings
from nebula_mq.wire.limits import MessageTooLarge
from tests.fixtures.channels import FLOW, connected, dead_letters


class Published(Hook):
    def __init__(self) -> None:
        self.ids: list[str] = []

    def on_published(self, event: MessageEvent) -> None:
        self.ids.append(event.message_id)


def limited(worker: Worker, max_message_bytes: int) -> None:
    transport = dataclasses.replace(worker.settings.transport, max_message_bytes=max_message_bytes)
    worker.settings = dataclasses.replace(worker.settings, transport=transport)


@pytest.mark.parametrize("encrypt", [False, True])
def test_an_oversized_envelope_is_refused_before_it_is_published(tmp_path: Path, encrypt: bool) -> None:
    sender, receiver, _ = connected(tmp_path, encrypt=encrypt)
    limited(sender, 4096)
    published = Published()
    sender.hooks.add(published)
    outbox = Outbox(sender, FLOW, "enc-0")
    x = np.random.default_rng(0).normal(size=(32, 32)).astype(np.float32)  # 4 KiB raw: over with the header
    with pytest.raises(MessageTooLarge) as info:
        outbox.send(step=0, micro_batch=7, tensors={"h": (x, Identity())})
    text = str(info.value)
    assert isinstance(info.value, OversizedMessage) and "\n" not in text
    assert text.startswith("flow 'activations' micro-batch 7: ") and "> max_message_bytes 4096 bytes; fp16 (" in text
    outbox.flush()
    assert published.ids == [] and sender.transport.queue_depth(sender.transport.queue_for(FLOW)) == 0
    # The codec it names fits, on the same outbox.
    mid = outbox.send(step=0, micro_batch=7, tensors={"h": (x, FP16())})
    outbox.flush()
    got = Inbox(receiver, FLOW).get(timeout=1.0)
    assert got is not None and got.message_id == mid and published.ids == [mid]
    assert dead_letters(receiver) == []


def test_a_job_above_the_brokers_max_message_size_is_refused_at_load(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\nid = "big"\n[transport]\nmax_message_bytes = {BROKER_MAX_MESSAGE_BYTES + 1}\n')
    with pytest.raises(ConfigError) as info:
        load_settings(job)
    assert "\n" not in str(info.value) and "transport.max_message_bytes" in str(info.value)
    assert str(BROKER_MAX_MESSAGE_BYTES) in str(info.value)
    job.write_text(f'[job]\nid = "big"\n[transport]\nmax_message_bytes = {BROKER_MAX_MESSAGE_BYTES}\n')
    assert load_settings(job).transport.max_message_bytes == BROKER_MAX_MESSAGE_BYTES
    assert TransportSettings().max_message_bytes < BROKER_MAX_MESSAGE_BYTES
