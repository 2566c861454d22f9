"""The security layer on real broker nodes (session fixture ``stack``).

Each refusal shows a clear error on the client side and an audit record (the
broker's own log, copied by ``BrokerLogAuditor``; certificate and message
events recorded by the security API), while legitimate traffic keeps flowing:
plaintext, TLS 1.0 and 1.1 (on the node's port and on the WAN relay's port), no
client certificate, a foreign CA, a revoked certificate, the wrong vhost, a
missing permission, a forged tag, a replayed message, an edited audit line.
"""

from __future__ import annotations

import dataclasses
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pika
import pika.exceptions
import pytest

from nebula_mq import topology
from nebula_mq.cli import main
from nebula_mq.codecs import parse_codec
from nebula_mq.errors import AccessRefused, WireError
from nebula_mq.runtime.ordered import InOrderBuffer
from nebula_mq.security.audit import AuditLog, verify_chain
from nebula_mq.security.auth import MessageAuth
from nebula_mq.security.broker_log import BrokerLogAuditor
from nebula_mq.security.certs import ClusterCA
from nebula_mq.security.keys import KeyRing, ensure_job_key
from nebula_mq.security.lifecycle import revoke_cert, rotate
from nebula_mq.settings import TransportSettings
from nebula_mq.stack.node import log_file
from nebula_mq.transport.base import REASON_HEADER
from nebula_mq.transport.rabbit import RabbitTransport
from nebula_mq.wire import Envelope, decode_envelope, encode_envelope, pack_tensors
from tests.fixtures.roles import decoder, encoder
from tests.fixtures.stack import StackHandle, pika_parameters, publish_refused, tls_context

pytest_plugins = ["tests.fixtures.stack"]
pytestmark = pytest.mark.broker

A, B = "cluster-a", "cluster-b"
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
SETTINGS = TransportSettings(max_queue_bytes=1 << 22, publish_patience_s=30, prefetch=8)


@dataclasses.dataclass
class Sec:
    stack: StackHandle
    job: Any
    audit: AuditLog
    auditors: dict[str, BrokerLogAuditor]
    key_file: Path
    _used: set[int] = dataclasses.field(default_factory=set)

    def expect(self, cluster: str, event: str, timeout: float = 10.0, **fields: str) -> dict[str, Any]:
        """Wait until the broker log of ``cluster`` yields ``event`` with ``fields``; returns the record."""
        deadline = time.monotonic() + timeout
        while True:
            self.auditors[cluster].scan()
            for rec in self.audit.records():
                if (rec["event"] == event and rec.get("cluster") == cluster and rec["seq"] not in self._used
                        and all(rec.get(k) == v for k, v in fields.items())):
                    self._used.add(rec["seq"])  # each refusal is matched by one record
                    return rec
            if time.monotonic() > deadline:
                raise AssertionError(f"no audit record {event} {fields} on {cluster}")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def sec(stack: StackHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sec]:
    root = tmp_path_factory.mktemp("security")
    audit = AuditLog(root / "audit.jsonl")
    flows = topology.abnet_flows(A, B, ("enc-0",))
    job = stack.new_job(flows, {A: [encoder("enc-0"), "inspector-a", "rot-0", "rev-0"],
                                B: [decoder("dec-0", ["enc-0"]), "inspector-b"]}, prefix="sec")
    auditors = {}
    for n in stack.stack.layout.nodes:
        auditors[n.cluster] = BrokerLogAuditor(log_file(n), audit, n.cluster, root / f"{n.cluster}.cursor")
        auditors[n.cluster].skip_to_end()
    key_file = root / "keys" / "job.key"
    ensure_job_key(key_file, job.job_id)
    audit.record("job_submitted", job=job.job_id, tenant="alice")
    yield Sec(stack, job, audit, auditors, key_file)


def _connect(params: Any) -> None:
    conn = pika.BlockingConnection(params)
    try:
        conn.channel()
    finally:
        conn.close()


def _refused(params: Any, alert: str) -> None:
    """The connection fails; with TLS 1.3 the client sees the broker's alert, or only the closed
    stream when it raced ahead with its first AMQP bytes (the alert is then in the broker's log)."""
    with pytest.raises(pika.exceptions.AMQPConnectionError, match=f"{alert}|EOF occurred"):
        _connect(params)


def _old_tls(port: int, settings: Any, version: ssl.TLSVersion) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(settings.ca_file)
    ctx.load_cert_chain(settings.cert_file, settings.key_file)
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # this client can speak the old versions
    ctx.minimum_version = ctx.maximum_version = version
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        ctx.wrap_socket(raw, server_hostname="localhost")


# --------------------------------------------------------------------------- transport-level refusals


def _ports(sec: Sec) -> list[tuple[str, int]]:
    """Every port the stack opens for AMQP: the node's listener and the WAN relay in front of it."""
    n = sec.stack.stack.layout.node(A)
    return [("node", n.tls_port), ("relay", n.relay_port)]


def test_plaintext_is_refused_on_every_port(sec: Sec) -> None:
    for _what, port in _ports(sec):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(AMQP_HEADER)
            reply = s.recv(64)
        assert reply[:1] == b"\x15"  # a TLS alert record, never AMQP's connection.start
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1,
                                                              socket_timeout=5))
        sec.expect(A, "connection_refused", reason="not_tls")


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1], ids=["tls1.0", "tls1.1"])
def test_tls_below_1_2_is_refused_on_every_port(sec: Sec, version: ssl.TLSVersion) -> None:
    settings = sec.job.settings(A, "inspector-a")
    for _what, port in _ports(sec):
        with pytest.raises(ssl.SSLError, match="(?i)alert protocol version"):
            _old_tls(port, settings, version)
        rec = sec.expect(A, "connection_refused", reason="tls_version_too_old")
        assert rec["alert"] == "Protocol Version"


def test_no_client_certificate_is_refused(sec: Sec) -> None:
    settings = sec.job.settings(A, "inspector-a")
    ctx = ssl.create_default_context(cafile=settings.ca_file)
    _refused(pika_parameters(settings, ctx), "CERTIFICATE_REQUIRED")
    sec.expect(A, "connection_refused", reason="no_client_certificate")


def test_certificate_from_a_foreign_ca_is_refused(sec: Sec, tmp_path: Path) -> None:
    settings = sec.job.settings(A, "inspector-a")
    rogue = ClusterCA(tmp_path, A).ensure_client("inspector-a")  # same CN, CA nobody trusts
    ctx = ssl.create_default_context(cafile=settings.ca_file)
    ctx.load_cert_chain(str(rogue.cert_file), str(rogue.key_file))
    _refused(pika_parameters(settings, ctx), "BAD_CERTIFICATE")
    sec.expect(A, "connection_refused", reason="untrusted_certificate")


def test_revoked_certificate_is_refused_at_the_next_connection(sec: Sec) -> None:
    settings = sec.job.settings(A, "rev-0")
    _connect(pika_parameters(settings))  # valid before
    sec.expect(A, "connection_accepted", user="rev-0")
    revoke_cert(sec.stack.stack.layout.certs_dir, A, "rev-0", sec.audit)
    t0 = time.monotonic()
    _refused(pika_parameters(settings, tls_context(settings)), "CERTIFICATE_REVOKED")  # same (revoked) files
    assert time.monotonic() - t0 < 5  # no broker restart, no cache to wait for
    sec.expect(A, "connection_refused", reason="certificate_revoked")
    assert [r for r in sec.audit.records() if r["event"] == "cert_revoked" and r["cn"] == "rev-0"]
    # Legitimate traffic is unaffected: another identity still connects.
    _connect(pika_parameters(sec.job.settings(A, "inspector-a")))


def test_wrong_vhost_is_refused(sec: Sec, stack: StackHandle) -> None:
    other = stack.new_job(prefix="secother")
    mine = sec.job.settings(A, "inspector-a")
    with pytest.raises(pika.exceptions.AMQPConnectionError) as err:
        _connect(pika_parameters(dataclasses.replace(mine, vhost=other.vhost)))
    assert "refused" in str(err.value).lower() or "530" in repr(err.value)
    rec = sec.expect(A, "connection_refused", reason="vhost_refused", user="inspector-a")
    assert rec["vhost"] == other.vhost


def test_each_role_only_has_its_own_permissions(sec: Sec) -> None:
    job = sec.job
    conn = pika.BlockingConnection(pika_parameters(job.settings(A, "enc-0")))
    try:
        # The encoder may not read activations (only publish them)...
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            conn.channel().basic_get(job.queue("activations"))
        assert err.value.reply_code == 403 and "access to queue" in err.value.reply_text
        # ...nor create queues outside its role.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            conn.channel().queue_declare(job.queue("activations") + "-copy", durable=True)
        assert err.value.reply_code == 403
    finally:
        if conn.is_open:
            conn.close()
    conn = pika.BlockingConnection(pika_parameters(job.settings(B, "dec-0")))
    try:
        # The decoder reads activations, never the encoder's gradient replies.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            conn.channel().basic_get(job.queue("reply-enc-0"))
        assert err.value.reply_code == 403
    finally:
        if conn.is_open:
            conn.close()
    rec = sec.expect(A, "permission_denied", user="enc-0", operation="basic.get")
    assert "activations" in rec["detail"]
    sec.expect(A, "permission_denied", user="enc-0", operation="queue.declare")
    sec.expect(B, "permission_denied", user="dec-0", operation="basic.get")



def test_roles_publish_only_into_their_own_flows(sec: Sec, stack: StackHandle) -> None:
    """Issue 7: the encoder may publish activations and read gradient replies, nothing else."""
    flows = topology.abnet_flows(A, B, ("penc-0",))
    job = stack.new_job(flows, {A: [encoder("penc-0")], B: [decoder("pdec-0", ["penc-0"])]}, prefix="secpub")
    act, reply = job.queue("activations"), job.queue("reply-penc-0")
    enc = RabbitTransport(job.settings(A, "penc-0"), SETTINGS, job.job_id, A)
    dec = RabbitTransport(job.settings(B, "pdec-0"), SETTINGS, job.job_id, B)
    with enc, dec:
        enc.declare_flow(flows[0], "producer")
        enc.declare_flow(flows[1], "consumer")
        dec.declare_flow(flows[0], "consumer")
        dec.declare_flow(flows[1], "producer")
        dec.declare_dead_letter_queue()
        # Allowed: activations A -> B, the gradient reply B -> A (to reply_to), a dead letter on B.
        enc.publisher().publish(act, b"activation", "m-act", reply_to=reply, correlation_id="c-1")
        request = dec.consume(act, 4).get(20)
        assert request is not None and request.reply_to == reply and bytes(request.body) == b"activation"
        dec.publisher().publish(request.reply_to, b"gradient", "m-grad", correlation_id=request.correlation_id)
        request.ack()
        dec.dead_letter(b"condemned", "m-dead", "bad_tag", original_queue=act)
        got = enc.consume(reply, 4).get(20)
        assert got is not None and bytes(got.body) == b"gradient" and got.correlation_id == "c-1"
        got.ack()
        assert stack.stack.queue_depths(B, job.vhost)[topology.dead_letter_queue(job.job_id)].messages == 1
        # Refused: the encoder publishing into its own reply queue, through the transport...
        with pytest.raises(AccessRefused, match="403"):
            enc.publisher().publish(reply, b"forged gradient", "m-forged")
        # The decoder publishing activations.
        with pytest.raises(AccessRefused, match="403"):
            dec.publisher().publish(act, b"forged activation", "m-forged-act")
    # ...and by hand, through the default exchange or straight to the reply flow's exchange.
    enc_settings = job.settings(A, "penc-0")
    assert "amq.default" in publish_refused(enc_settings, "", reply)
    assert topology.flow_exchange(job.job_id, "reply-penc-0") in publish_refused(
        enc_settings, topology.flow_exchange(job.job_id, "reply-penc-0"), reply)
    # The encoder's exchange routes only into activations: another routing key is unroutable.
    conn = pika.BlockingConnection(pika_parameters(enc_settings))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish(topology.flow_exchange(job.job_id, "activations"), reply, b"x",
                             pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        conn.close()
    assert stack.stack.queue_depths(A, job.vhost)[reply].messages == 0
    assert stack.stack.queue_depths(B, job.vhost)[act].messages == 0
    sec.expect(A, "permission_denied", user="penc-0", operation="basic.publish")
    sec.expect(B, "permission_denied", user="pdec-0", operation="basic.publish")


# --------------------------------------------------------------------------- message authentication


def _envelope(job_id: str, mb: int, value: float) -> Envelope:
    x = np.full((16, 16), value, dtype=np.float32)
    return Envelope(job_id, "activations", 0, mb, mb, "enc-0", pack_tensors({"h": x}, parse_codec("none")))


def _receive(consumer: Any, auth: MessageAuth, order: InOrderBuffer[int], want: int, timeout: float = 20.0
             ) -> tuple[list[int], list[str], int]:
    """Consume until ``want`` outcomes: applied micro-batches, dead-letter reasons, duplicates dropped.
    ``order`` is the stream's counter, as the ordered inbox keeps it (``runtime.ordered``)."""
    applied: list[int] = []
    rejected: list[str] = []
    dropped = 0
    deadline = time.monotonic() + timeout
    while len(applied) + len(rejected) + dropped < want and time.monotonic() < deadline:
        d = consumer.get(0.5)
        if d is None:
            continue
        try:
            env = decode_envelope(d.body, max_bytes=1 << 24)
            auth.verify(env)
        except WireError as exc:
            d.dead_letter(exc.reason, str(exc))
            rejected.append(exc.reason)
            continue
        if order.is_duplicate(env.micro_batch):
            dropped += 1
        else:
            order.push(env.micro_batch, env.micro_batch)
            applied += [ready.item for ready in order.pop_ready()]
        d.ack()
    return applied, rejected, dropped


def test_signed_traffic_flows_while_forged_and_replayed_messages_are_dead_lettered(sec: Sec, tmp_path: Path) -> None:
    job = sec.job
    window = 3.0
    sender = MessageAuth(KeyRing.load(sec.key_file))
    receiver = MessageAuth(KeyRing.load(sec.key_file), audit=sec.audit, window_s=window, consumer="dec-0")
    enc = RabbitTransport(job.settings(A, "enc-0"), SETTINGS, job.job_id, A)
    dec = RabbitTransport(job.settings(B, "dec-0"), SETTINGS, job.job_id, B)
    with enc, dec:
        queue = enc.declare_flow(job.flows[0], "producer")
        dec.declare_flow(job.flows[0], "consumer")
        dec.declare_dead_letter_queue()
        pub = enc.publisher()
        consumer = dec.consume(queue, 8)
        frames = []
        for mb in range(5):
            env = _envelope(job.job_id, mb, float(mb))
            frames.append(encode_envelope(env, signer=sender.signer()))
            pub.publish(queue, frames[-1], env.message_id)
        signed_at = time.time()
        # Forged: micro-batch 9 with the tag of micro-batch 0 (the checksum is recomputed, so only the tag tells).
        genuine = decode_envelope(frames[0], max_bytes=1 << 24)
        forged = dataclasses.replace(_envelope(job.job_id, 9, 666.0), auth_tag=genuine.auth_tag)
        pub.publish(queue, encode_envelope(forged), forged.message_id)
        # Unsigned.
        pub.publish(queue, encode_envelope(_envelope(job.job_id, 10, 0.0)), "unsigned")
        applied, rejected, dropped = _receive(consumer, receiver, InOrderBuffer(0), 7)
        assert applied == [0, 1, 2, 3, 4] and sorted(rejected) == ["bad_tag", "bad_tag"] and dropped == 0

        # Replay inside the window: the same bytes again are a duplicate, dropped and not applied,
        # by the counter a restart from the step-5 checkpoint restores.
        order = InOrderBuffer[int](5)
        pub.publish(queue, frames[1], "replay-1")
        assert _receive(consumer, receiver, order, 1) == ([], [], 1)
        # Replay after the window: rejected as replayed, whatever the counter says.
        time.sleep(max(0.0, signed_at + window + 0.5 - time.time()))
        pub.publish(queue, frames[2], "replay-2")
        assert _receive(consumer, receiver, InOrderBuffer(0), 1) == ([], ["replayed"], 0)
        # Legitimate traffic still flows after the attacks.
        env = _envelope(job.job_id, 5, 5.0)
        pub.publish(queue, encode_envelope(env, signer=sender.signer()), env.message_id)
        assert _receive(consumer, receiver, order, 1) == ([5], [], 0)

    # Dead-lettered with their reasons (read by a job-wide inspector identity on cluster-b).
    conn = pika.BlockingConnection(pika_parameters(job.settings(B, "inspector-b")))
    try:
        ch = conn.channel()
        reasons = []
        while (got := ch.basic_get(topology.dead_letter_queue(job.job_id), auto_ack=True))[0] is not None:
            reasons.append(got[1].headers[REASON_HEADER])
        assert sorted(reasons) == ["bad_tag", "bad_tag", "replayed"]
    finally:
        conn.close()
    audited = [r for r in sec.audit.records() if r["event"] == "message_rejected"]
    assert sorted(r["reason"] for r in audited) == ["bad_tag", "bad_tag", "replayed"]
    assert {r["message_id"] for r in audited} >= {forged.message_id}
    assert verify_chain(sec.audit.path).records == len(list(sec.audit.records()))


def test_sealed_payloads_cross_the_wan_and_the_broker_sees_no_tensor(sec: Sec) -> None:
    job = sec.job
    auth = MessageAuth(KeyRing.load(sec.key_file))
    marker = np.full((32,), 4242.25, dtype=np.float32)
    env = Envelope(job.job_id, "activations", 1, 0, 0, "enc-0", pack_tensors({"h": marker}, parse_codec("none")))
    sealed = auth.seal(encode_envelope(env, signer=auth.signer()))
    assert marker.tobytes() not in sealed
    enc = RabbitTransport(job.settings(A, "enc-0"), SETTINGS, job.job_id, A)
    dec = RabbitTransport(job.settings(B, "dec-0"), SETTINGS, job.job_id, B)
    with enc, dec:
        queue = enc.declare_flow(job.flows[0], "producer")
        dec.declare_flow(job.flows[0], "consumer")
        enc.publisher().publish(queue, sealed, env.message_id)
        d = dec.consume(queue, 4).get(20)
        assert d is not None and bytes(d.body) == sealed  # what the brokers stored and forwarded
        got = decode_envelope(auth.open(d.body), max_bytes=1 << 24)
        auth.verify(got)
        assert got.message_id == env.message_id
        d.ack()


# --------------------------------------------------------------------------- rotation, audit


def test_rotation_loses_no_in_flight_message(sec: Sec, tmp_path: Path) -> None:
    job = sec.job
    settings = job.settings(A, "rot-0")
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(settings.cert_file, old / "cert.pem")
    shutil.copy(settings.key_file, old / "key.pem")
    conn = pika.BlockingConnection(pika_parameters(settings))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        q = job.queue("activations")
        ch.queue_declare(q, passive=True)
        ch.queue_purge(q)
        for i in range(50):
            ch.basic_publish("", q, str(i).encode(), pika.BasicProperties(delivery_mode=2), mandatory=True)
        new = rotate(sec.stack.stack.layout.certs_dir, A, "rot-0", sec.audit)
        # The open connection keeps working: every in-flight message is still delivered.
        got = []
        while (m := ch.basic_get(q))[0] is not None:
            got.append(int(m[2]))
            ch.basic_ack(m[0].delivery_tag)
        assert got == list(range(50))
    finally:
        conn.close()
    stale = dataclasses.replace(settings, cert_file=str(old / "cert.pem"), key_file=str(old / "key.pem"))
    _refused(pika_parameters(stale), "CERTIFICATE_REVOKED")
    sec.expect(A, "connection_refused", reason="certificate_revoked")
    _connect(pika_parameters(dataclasses.replace(settings, cert_file=str(new.cert_file),
                                                 key_file=str(new.key_file))))
    assert [r for r in sec.audit.records() if r["event"] == "cert_rotated" and r["cn"] == "rot-0"]


def test_the_runs_audit_log_verifies_and_an_edited_line_is_caught(sec: Sec, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for cluster in (A, B):
        sec.auditors[cluster].scan()
    events = {r["event"] for r in sec.audit.records()}
    assert {"job_submitted", "connection_accepted", "connection_refused"} <= events
    assert main(["audit", "verify", "--log", str(sec.audit.path)]) == 0
    copy = tmp_path / "edited.jsonl"
    lines = sec.audit.path.read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if '"connection_refused"' in line)
    lines[k] = lines[k].replace('"connection_refused"', '"connection_accepted"')
    copy.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["audit", "verify", "--log", str(copy)]) == 1
    assert f"edited.jsonl:{k + 1}: hash does not match" in capsys.readouterr().err
