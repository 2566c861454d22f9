"""Certificates: per-cluster CAs, trust bundles, key modes, idempotency and renewal."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq.errors import CertificateError
from nebula_mq.security import certs
from nebula_mq.security.certs import ClusterCA, federation_identity, init_certs


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _cn(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_init_creates_cas_servers_and_federation_clients(tmp_path: Path) -> None:
    cas = init_certs(tmp_path, ["cluster-a", "cluster-b"], [("cluster-a", "enc-0")])
    a, b = cas["cluster-a"], cas["cluster-b"]
    server = _cert(a.server().cert_file)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "cluster-a"} <= set(sans.get_values_for_type(x509.DNSName))
    assert [str(i) for i in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    fed_b = _cert(b.client(federation_identity("cluster-b")).cert_file)
    assert _cn(fed_b) == "federation-cluster-b"
    fed_b.verify_directly_issued_by(_cert(b.ca_cert_file))
    assert _cn(_cert(a.client("enc-0").cert_file)) == "enc-0"
    assert fed_b.not_valid_after_utc > fed_b.not_valid_before_utc


def test_private_keys_are_0600_and_certificates_public(tmp_path: Path) -> None:
    init_certs(tmp_path, ["cluster-a"], [("cluster-a", "w")])
    keys = list(tmp_path.rglob("*.key")) + list(tmp_path.rglob("key.pem"))
    assert len(keys) == 4  # CA, server, federation client, worker
    for key in keys:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    for pem in tmp_path.rglob("cert.pem"):
        assert stat.S_IMODE(pem.stat().st_mode) == 0o644
    assert not list(tmp_path.rglob("*.tmp"))


def test_trust_bundle_lets_each_broker_verify_the_peers_federation_client(tmp_path: Path) -> None:
    cas = init_certs(tmp_path, ["cluster-a", "cluster-b"])
    a, b = cas["cluster-a"], cas["cluster-b"]
    # Broker A verifies B's federation client with A's trust bundle, via OpenSSL itself.
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_verify_locations(str(a.trust_file))
    subjects = {dict(x[0] for x in c["subject"])["commonName"] for c in server.get_ca_certs()}
    assert subjects == {"nebula-mq CA cluster-a", "nebula-mq CA cluster-b"}
    _cert(b.client(federation_identity("cluster-b")).cert_file).verify_directly_issued_by(
        _cert(b.ca_cert_file))


def test_rerun_keeps_valid_certificates(tmp_path: Path) -> None:
    init_certs(tmp_path, ["cluster-a", "cluster-b"])
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.pem")}
    init_certs(tmp_path, ["cluster-a", "cluster-b"])
    after = {p: p.read_bytes() for p in tmp_path.rglob("*.pem")}
    assert before == after


def test_expiring_leaf_is_reissued_but_ca_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = ClusterCA(tmp_path, "cluster-a")
    first = ca.ensure_client("w").cert_file.read_bytes()
    ca_pem = ca.ca_cert_file.read_bytes()
    # Leaves live LEAF_DAYS; anything renewing earlier than that counts as expiring.
    monkeypatch.setattr(certs, "RENEW_BEFORE", certs.dt.timedelta(days=certs.LEAF_DAYS + 1))
    second = ca.ensure_client("w").cert_file.read_bytes()
    assert second != first
    assert ca.ca_cert_file.read_bytes() == ca_pem


def test_new_ca_reissues_its_leaves(tmp_path: Path) -> None:
    ca = ClusterCA(tmp_path, "cluster-a")
    ca.ensure_server()
    ca.ca_key_file.unlink()
    ca.ensure_server()
    _cert(ca.server().cert_file).verify_directly_issued_by(_cert(ca.ca_cert_file))


@pytest.mark.parametrize("bad", ["", "a b", "../etc", "-lead", "x" * 80])
def test_bad_names_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(CertificateError):
        ClusterCA(tmp_path, "cluster-a").ensure_client(bad)
    with pytest.raises(CertificateError):
        ClusterCA(tmp_path, bad)


def test_identity_on_unknown_cluster_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CertificateError):
        init_certs(tmp_path, ["cluster-a"], [("cluster-z", "w")])


@settings(max_examples=15, deadline=None)
@given(cn=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True))
def test_client_cn_is_the_identity(tmp_path_factory: pytest.TempPathFactory, cn: str) -> None:
    ca = ClusterCA(tmp_path_factory.mktemp("ca"), "c")
    ident = ca.ensure_client(cn)
    cert = _cert(ident.cert_file)
    assert _cn(cert) == cn
    cert.verify_directly_issued_by(_cert(ca.ca_cert_file))
