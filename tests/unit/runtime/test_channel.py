"""Envelope channels: every kind of hostile input is dead-lettered with its reason,
counted, and the consumer keeps going; good traffic still flows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nebula_mq.codecs import FP16, Identity
from nebula_mq.errors import OutOfWindow
from nebula_mq.runtime.channel import Inbox, Outbox, Received
from nebula_mq.runtime.ordered import FlowWindow, OrderedInbox
from nebula_mq.runtime.role import StepInputs
from nebula_mq.settings import JobSettings, Settings, TransportSettings
from nebula_mq.transport.memory import MemoryBroker, MemoryTransport
from nebula_mq.runtime.worker import Worker
from tests.fixtures.channels import FLOW, bare, connected, dead_letters, make
from nebula_mq.wire import Envelope, encode_envelope, pack_tensors

def raw_publish(sender: Worker, body: bytes, mid: str) -> None:
    pub = sender.transport.publisher()
    pub.publish(sender.transport.queue_for(FLOW), body, mid)
    pub.close()


def envelope(job: str = "chan", mb: int = 0, tensor: np.ndarray | None = None) -> Envelope:
    x = np.ones((2, 3), np.float32) if tensor is None else tensor
    return Envelope(job, FLOW.name, mb, mb, mb, "enc-0", pack_tensors({"x": x}, Identity(),
                    allow_non_finite=True))


def test_hostile_inputs_are_dead_lettered_and_good_traffic_flows(pair: tuple[Worker, Worker, MemoryBroker]) -> None:
    sender, receiver, _ = pair
    sign = sender.auth.signer
    good = encode_envelope(envelope(mb=0), signer=sign())
    corrupt = bytearray(encode_envelope(envelope(mb=1), signer=sign()))
    corrupt[-5] ^= 0xFF
    unsigned = encode_envelope(envelope(mb=2))
    other_job = encode_envelope(envelope(job="other", mb=3), signer=sign())
    nan = encode_envelope(envelope(mb=4, tensor=np.array([[np.nan, 1.0]], np.float32)), signer=sign())
    old = encode_envelope(envelope(mb=5), signer=sender.auth.signer(now_ms=1_000))  # 1970: a replay
    future = encode_envelope(envelope(mb=6), signer=sender.auth.signer(now_ms=2**52))
    bad_codec = bytearray(good)
    # Tamper with the codec id and re-sign: a well-formed, authentic, undecodable message.
    env = envelope(mb=7)
    rec = env.tensors[0]
    broken = type(rec)(rec.name, rec.shape, rec.dtype, rec.codec,
                       type(rec.encoded)(99, {}, rec.encoded.shape, rec.encoded.dtype, rec.encoded.parts))
    bad_codec = encode_envelope(Envelope("chan", FLOW.name, 7, 7, 7, "enc-0", (broken,)), signer=sign())
    wrong_shape = type(rec)(rec.name, (5, 5), rec.dtype, rec.codec, rec.encoded)
    bad_shape = encode_envelope(Envelope("chan", FLOW.name, 8, 8, 8, "enc-0", (wrong_shape,)), signer=sign())
    for i, body in enumerate([bytes(corrupt), unsigned, other_job, nan, old, future, bytes(bad_codec),
                              bad_shape, good, good]):
        raw_publish(sender, body, f"m{i}")
    inbox = OrderedInbox(receiver, StepInputs((FLOW,)), 0, FlowWindow(ahead=4, unacked=2))
    assert inbox.receive(timeout=1.0)
    [got] = inbox.next_step() or ()
    assert got.micro_batch == 0
    np.testing.assert_array_equal(got.tensors["x"], np.ones((2, 3), np.float32))
    inbox.applied(got)
    assert inbox.receive(timeout=1.0)  # the second copy of `good`: a repeat
    assert inbox.next_step() is None and not inbox.receive(timeout=0.2)
    inbox.close()
    receiver.commit({}, {})
    dead_reasons = ["bad_checksum", "bad_tag", "unknown_job", "non_finite", "replayed", "replayed",
                    "unknown_codec", "bad_shape"]
    assert sorted(dead_letters(receiver)) == sorted(dead_reasons)
    metrics = receiver.report.metrics
    assert metrics.of(metrics.dead_letters, "activations", "bad_tag")._value.get() == 1
    assert metrics.of(metrics.duplicates, "activations")._value.get() == 1
    audit = (Path(receiver.settings.run_dir) / "audit" / "audit.jsonl").read_text()
    assert audit.count('"message_rejected"') >= 3  # tag and replay failures are audited
    # Every dead letter is audited, with its reason, whatever caught it.
    dead = [json.loads(line) for line in audit.splitlines() if '"message_dead_lettered"' in line]
    assert sorted(r["reason"] for r in dead) == sorted(dead_reasons)
    assert {r["consumer"] for r in dead} == {"dec-0"} and all(r["message_id"] for r in dead)


def test_sealed_payloads_round_trip_and_hide_tensors(tmp_path: Path) -> None:
    sender, receiver, broker = connected(tmp_path, encrypt=True)
    secret = np.full((4, 4), 1234.5, np.float32)
    Outbox(sender, FLOW, "enc-0").send(step=0, micro_batch=0, tensors={"x": (secret, Identity())})
    queued = broker_bodies(broker, sender.transport.queue_for(FLOW))
    assert secret.tobytes() not in queued[0]
    inbox = Inbox(receiver, FLOW)
    got = inbox.get(timeout=1.0)
    assert got is not None
    np.testing.assert_array_equal(got.tensors["x"], secret)


def broker_bodies(broker: MemoryBroker, queue: str) -> list[bytes]:
    q = broker.queues[queue]  # peek without consuming
    return [m.body for m in q.ready]


@pytest.mark.parametrize("allow", [False, True])
def test_every_channel_follows_the_jobs_allow_non_finite(tmp_path: Path, allow: bool) -> None:
    """``[codec] allow_non_finite`` reaches every Outbox and Inbox from the job's settings (Scenario
    I's channels ignored it): NaN is refused at the sender unless the job allows it, then delivered."""
    from nebula_mq.errors import NonFiniteTensor

    sender, receiver, _ = connected(tmp_path, allow_non_finite=allow)
    outbox, inbox = Outbox(sender, FLOW, "enc-0"), Inbox(receiver, FLOW)
    nan = np.array([np.nan, 1.0], np.float32)
    if not allow:
        with pytest.raises(NonFiniteTensor):
            outbox.send(step=0, micro_batch=0, tensors={"x": (nan, Identity())})
        return
    outbox.send(step=0, micro_batch=0, tensors={"x": (nan, Identity())})
    got = inbox.get(timeout=5.0)
    assert got is not None and np.isnan(got.tensors["x"][0]) and got.tensors["x"][1] == 1.0
    assert dead_letters(receiver) == []


def test_the_ordered_inbox_hands_out_each_message_once_in_order_and_condemns_the_impossible(
        pair: tuple[Worker, Worker, MemoryBroker]) -> None:
    """Early arrivals wait for their turn, repeats are never handed out again, an index the peer
    could not have sent yet and a message the role refuses are dead-lettered with their reasons."""
    from nebula_mq.errors import MalformedMessage

    def refuse_3(received: Received) -> None:
        if received.micro_batch == 3:
            raise MalformedMessage("not for this role")

    sender, receiver, _ = pair
    window = FlowWindow(ahead=4, unacked=2)
    assert (window.window, window.held) == (4, 6)  # one formula for the window and the prefetch reserve
    outbox = Outbox(sender, FLOW, "enc-0")
    inbox = OrderedInbox(receiver, StepInputs((FLOW,)), 0, window, admit=refuse_3)
    x = np.ones(2, np.float32)
    for mb in (2, 0, 9, 1, 0):  # 9 is beyond [0, 4); 0 comes twice
        outbox.send(step=mb, micro_batch=mb, tensors={"x": (x, Identity())})
    got: list[int] = []
    for _ in range(50):
        inbox.receive(0.05)
        while (step := inbox.next_step()) is not None:
            got += [r.micro_batch for r in step]
            inbox.applied(*step)
        if len(got) == 3:
            break
    inbox.receive(0.2)  # the second 0: a repeat, never handed out
    assert got == [0, 1, 2] and inbox.next_step() is None

    outbox.send(step=3, micro_batch=3, tensors={"x": (x, Identity())})
    assert inbox.receive(5.0) and inbox.next_step() is None
    assert sorted(dead_letters(receiver)) == sorted([OutOfWindow.reason, MalformedMessage.reason])


def test_outbox_measures_compression(pair: tuple[Worker, Worker, MemoryBroker]) -> None:
    sender, _, _ = pair
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    Outbox(sender, FLOW, "enc-0").send(step=0, micro_batch=0, tensors={"x": (x, FP16())})
    raw = sender.report.metrics.of(sender.report.metrics.raw_bytes, "activations", "out")._value.get()
    wire = sender.report.metrics.of(sender.report.metrics.wire_bytes, "activations", "out")._value.get()
    assert raw == x.nbytes
    assert 0.5 < wire / raw < 0.7  # fp16 halves the payload; the envelope adds a little


def test_worker_serves_prometheus_metrics_over_http(tmp_path: Path) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(job=JobSettings(id="chan", run_dir=str(tmp_path), metrics_port=port))
    worker = bare(settings, "s", "enc-0", MemoryTransport(MemoryBroker(), settings.transport, "chan", "s"))
    worker.step = 3
    worker.record_step({"loss": 1.5})
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, s.labels.get("name", "")): (s.value, s.labels)
               for f in text_string_to_metric_families(body) for s in f.samples}
    assert samples[("nebula_step", "")][0] == 3.0 and samples[("nebula_value", "loss")][0] == 1.5
    assert {k: samples[("nebula_step", "")][1][k] for k in ("job", "worker", "role", "cluster")} == {
        "job": "chan", "worker": "enc-0", "role": "test", "cluster": "s"}


def test_the_decoded_bytes_cap_comes_from_the_job_and_dead_letters_what_would_pass_it(tmp_path: Path) -> None:
    """[transport] max_decoded_bytes bounds what one message may decode to."""
    broker = MemoryBroker()
    sender = make(tmp_path, broker, "s", "enc-0")
    settings = Settings(job=JobSettings(id="chan", run_dir=str(tmp_path)),
                        transport=TransportSettings(publish_patience_s=5.0, max_decoded_bytes=4096))
    receiver = bare(settings, "t", "dec-0", MemoryTransport(broker, settings.transport, "chan", "t"))
    sender.transport.declare_flow(FLOW, "producer")
    receiver.transport.declare_flow(FLOW, "consumer")
    receiver.transport.declare_dead_letter_queue()
    outbox = Outbox(sender, FLOW, "enc-0")
    inbox = Inbox(receiver, FLOW)
    small, big = np.ones((4, 8), np.float32), np.ones((64, 64), np.float32)  # 128 B and 16 KiB decoded
    outbox.send(step=0, micro_batch=0, tensors={"x": (small, Identity())})
    outbox.send(step=1, micro_batch=1, tensors={"x": (big, FP16())})  # 8 KiB on the wire, 16 KiB decoded
    got = inbox.get(1.0)
    assert got is not None and got.micro_batch == 0
    assert inbox.get(0.2) is None
    assert dead_letters(receiver) == ["oversized"]
