"""Certificates rotated while a split job runs, on a private real TLS stack.

At step 60 of 300 the chaos runner's ``rotate`` fault gives the head's worker (cluster-a) a new
client certificate and cluster-a's broker a new server certificate, revokes both old serials,
and has the broker close every connection of the job: the head reconnects with its new files
(its publisher too, whose connection parameters were built at its start), and cluster-b's
federation link into cluster-a verifies the new server certificate. The job ends bit-identical
to its clean run, the broker accepted both after the rotation and refused no revoked
certificate, and a connection with the old (revoked) client certificate is refused. A second
test lets a client certificate expire, before the start and under open connections: one clear
``CertificateError`` each time, never a reconnect loop.

The stack is this module's own (``running_stack``): the session stack's broker certificate is
not changed under later tests.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from cryptography import x509

from nebula_mq import topology
from nebula_mq.chaos import Fault
from nebula_mq.errors import CertificateError, TransportError
from nebula_mq.security import lifecycle
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.broker_log import BrokerLogAuditor
from nebula_mq.security.certs import ClusterCA, federation_identity
from nebula_mq.settings import BrokerSettings, TransportSettings
from nebula_mq.stack.node import log_file
from nebula_mq.transport.connection import close_quietly, open_connection
from nebula_mq.transport.rabbit import RabbitTransport
from tests.fixtures.jobs import copy_split_example, run_chaos, split_job
from tests.fixtures.lanes import CPU_HEAVY
from tests.fixtures.short_certs import now, short_lived
from tests.fixtures.stack import CLUSTERS, StackHandle, pika_parameters, running_stack

pytestmark = [pytest.mark.broker, pytest.mark.paddle, pytest.mark.slow, CPU_HEAVY, pytest.mark.timeout(900)]

A, B = CLUSTERS
JOB = "certrot"
# The rotation (two certificates, the CRL, the broker's reload, closing the job's connections)
# takes 3-4 s while the split example runs ~80 steps/s on an idle machine: the job must still be
# running when its connections close, or no reconnection with the new certificate can be seen.
# A second fault right after it (a stall of no length) keeps the job held a few steps past the
# rotation's until the rotation is done (the chaos runner's step hold), so 300 steps are enough.
STEPS = 300
SCHEDULE = [Fault(60, "rotate", "head-0"), Fault(61, "stall", "tail-0", 0.0)]


@pytest.fixture(scope="module")
def own_stack() -> Iterator[StackHandle]:
    with running_stack(CLUSTERS, "rot") as handle:
        yield handle


def _serial(pem: Path) -> int:
    return x509.load_pem_x509_certificate(pem.read_bytes()).serial_number


def _served_serial(port: int, client: Any) -> int:
    """The serial of the certificate the broker on ``port`` presents now."""
    ctx = ssl.create_default_context(cafile=client.ca_file)
    ctx.load_cert_chain(client.cert_file, client.key_file)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_certificates_rotated_mid_run_lose_nothing_and_the_old_one_is_refused(
        own_stack: StackHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy_split_example(tmp_path)
    config = tmp_path / "job.toml"
    config.write_text(split_job(JOB, tmp_path / "run", seed=11, steps=STEPS, checkpoint_every=50))
    chaos_job = f"{JOB}-chaos"
    vhost, head_cn = topology.vhost(chaos_job), f"{chaos_job}.head-0"
    certs = own_stack.stack.layout.certs_dir
    node = own_stack.stack.layout.node(A)
    seen = AuditLog(tmp_path / "broker-events.jsonl")
    auditor = BrokerLogAuditor(log_file(node), seen, A, tmp_path / "cursor")
    auditor.skip_to_end()
    old: dict[str, Path] = {}
    real_rotate = lifecycle.rotate

    def keep_old_files(certs_dir: Any, cluster: str, cn: str, audit: AuditLog, **kw: Any) -> Any:
        """The real rotation, after a copy of the files it replaces (to try them afterwards)."""
        ident = ClusterCA(certs_dir, cluster).identity(cn)
        keep = tmp_path / "old" / cn
        keep.mkdir(parents=True)
        shutil.copy(ident.cert_file, keep / "cert.pem")
        shutil.copy(ident.key_file, keep / "key.pem")
        old[cn] = keep
        new = real_rotate(certs_dir, cluster, cn, audit, **kw)
        if cn == "server":
            auditor.skip_to_end()  # what the broker logs from here on comes after both rotations
        return new

    monkeypatch.setattr(lifecycle, "rotate", keep_old_files)
    report, text, logs = run_chaos(own_stack, config, SCHEDULE, 300)
    assert report.complete and report.identical, text
    assert len(report.faults) == len(SCHEDULE) and any("rotated" in line for line in logs), text
    assert set(old) == {head_cn, "server"}, text
    fault = json.loads((tmp_path / "run" / "chaos" / "faults.jsonl").read_text().splitlines()[0])
    history = (tmp_path / "run" / "chaos" / "history" / "head-0.jsonl").read_text().splitlines()
    assert json.loads(history[-1])["time"] > fault["ended"], "the job ended before the rotation did: the step hold did not keep it"

    # After the rotation the broker accepted the head's new certificate and cluster-b's federation
    # link (which verified the broker's new certificate), and refused no revoked certificate.
    after = auditor.scan()
    accepted = {e["user"] for e in after if e["event"] == "connection_accepted" and e["vhost"] == vhost}
    assert {head_cn, federation_identity(B)} <= accepted, after
    assert not [e for e in after if e.get("reason") == "certificate_revoked"], after
    head_log = (tmp_path / "run" / "chaos" / "logs" / "head-0.log").read_text()
    assert "connection lost" in head_log  # the broker closed its connections: it reconnected

    # The broker presents its new certificate; the old serials are revoked and audited.
    ca = ClusterCA(certs, A)
    current = own_stack.broker_settings(A, head_cn, vhost=vhost)
    assert _served_serial(node.tls_port, current) == _serial(ca.server().cert_file) != _serial(old["server"] / "cert.pem")
    revoked = ca.revoked_serials()
    assert {_serial(old[head_cn] / "cert.pem"), _serial(old["server"] / "cert.pem")} <= set(revoked)
    rotated = [json.loads(line) for line in (tmp_path / "run" / "chaos" / "audit" / "audit.jsonl").read_text().splitlines()]
    assert {r["cn"] for r in rotated if r["event"] == "cert_rotated" and r["old_revoked"]} == {head_cn, "server"}

    # The old client certificate is refused (the broker logs why); the new one logs in.
    stale = dataclasses.replace(current, cert_file=str(old[head_cn] / "cert.pem"),
                                key_file=str(old[head_cn] / "key.pem"))
    with pytest.raises(TransportError, match="CERTIFICATE_REVOKED|EOF occurred"):
        close_quietly(open_connection(stale, "stale"))
    deadline = time.monotonic() + 15
    while not [e for e in auditor.scan() if e.get("reason") == "certificate_revoked"]:
        assert time.monotonic() < deadline, "the broker logged no certificate_revoked refusal"
        time.sleep(0.2)
    close_quietly(open_connection(current, "renewed"))


def test_an_expired_client_certificate_fails_the_worker_with_one_clear_error(
        own_stack: StackHandle, tmp_path: Path) -> None:
    """At the start, and at the first reconnect after it expired under an open connection: one
    ``CertificateError`` naming the file, the date and the command, never a retry loop. The
    broker itself refuses such a certificate too (``certificate_expired`` in its log)."""
    job = own_stack.new_job(identities={A: ["exp-0"], B: ["exp-1"]}, prefix="exp")
    certs = own_stack.stack.layout.certs_dir
    node = own_stack.stack.layout.node(A)

    def settings(cn: str) -> BrokerSettings:
        ident = ClusterCA(certs, A).client(cn)
        return BrokerSettings(port=node.tls_port, vhost=job.vhost, tls=True, ca_file=str(ident.ca_file),
                              cert_file=str(ident.cert_file), key_file=str(ident.key_file), heartbeat_s=10)

    # Expired before the start: refused here, before any handshake.
    short_lived(certs, A, "exp-0", now() - dt.timedelta(hours=1))
    t0 = time.monotonic()
    with pytest.raises(CertificateError, match="expired on .*" + re.escape(f"nebula-mq certs rotate {certs.resolve()} {A} exp-0")):
        RabbitTransport(settings("exp-0"), TransportSettings(), job.job_id, A).open()
    assert time.monotonic() - t0 < 5

    # The broker refuses it as well (a client whose clock is behind would present it).
    auditor = BrokerLogAuditor(log_file(node), AuditLog(tmp_path / "events.jsonl"), A, tmp_path / "cursor")
    auditor.skip_to_end()
    with pytest.raises(pika.exceptions.AMQPConnectionError, match="CERTIFICATE_EXPIRED|EOF occurred"):
        pika.BlockingConnection(pika_parameters(settings("exp-0"))).close()
    deadline = time.monotonic() + 15
    while not [e for e in auditor.scan() if e.get("reason") == "certificate_expired"]:
        assert time.monotonic() < deadline, "the broker logged no certificate_expired refusal"
        time.sleep(0.2)

    # Expires under open connections: they run on until the broker drops them; then the
    # consumer's reconnect fails once and its waiting get() raises, and the publisher fails the
    # message that waits for a confirm, instead of waiting for ever.
    end = now() + dt.timedelta(seconds=12)  # time to connect, learn a route and publish first
    short_lived(certs, A, "exp-0", end)
    transport = RabbitTransport(settings("exp-0"), TransportSettings(publish_patience_s=60), job.job_id, A)
    consumer = transport.consume(topology.dead_letter_queue(job.job_id))
    publisher = transport.publisher()
    activations = job.queue("activations")
    try:
        publisher.publish(activations, b"before", "exp/1")  # confirmed; its route is learnt
        assert consumer.get(timeout=0.1) is None  # connected, nothing to read
        time.sleep(max(0.0, (end - now()).total_seconds()) + 1.0)
        own_stack.stack.rabbitmqctl(A, "close_all_connections", "--vhost", job.vhost, "test: expired")
        t0 = time.monotonic()
        with pytest.raises(CertificateError, match="expired on"):
            consumer.get(timeout=30)
        with pytest.raises(CertificateError, match="expired on"):
            publisher.publish(activations, b"after", "exp/2")
        assert time.monotonic() - t0 < 20
    finally:
        transport.close()
