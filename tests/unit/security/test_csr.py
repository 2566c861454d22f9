"""Certificates for real deployments: a broker's certificate names its hostnames, and the
request/sign/install flow issues a certificate whose key never leaves the host that made it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from nebula_mq.cli import main
from nebula_mq.errors import CertificateError
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.certs import ClusterCA, init_certs
from nebula_mq.security.csr import install, request, sign
from nebula_mq.security.lifecycle import issue, rotate


def _names(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(sans.get_values_for_type(x509.DNSName)) | {str(i) for i in sans.get_values_for_type(x509.IPAddress)}


def test_a_broker_certificate_carries_the_hostnames_it_is_reached_by_and_keeps_them(tmp_path: Path) -> None:
    init_certs(tmp_path, ["cluster-a"])
    audit = AuditLog(tmp_path / "audit.jsonl")
    ident = issue(tmp_path, "cluster-a", "server", audit, hostnames=["broker-a.example.org"])
    assert {"localhost", "cluster-a", "127.0.0.1", "broker-a.example.org"} <= _names(ident.cert_file)
    # Adding a second name keeps the first; a rotation keeps both; the stack's own refresh too.
    issue(tmp_path, "cluster-a", "server", audit, hostnames=["a.dc1.example.org"])
    rotate(tmp_path, "cluster-a", "server", audit)
    init_certs(tmp_path, ["cluster-a"])
    assert {"broker-a.example.org", "a.dc1.example.org"} <= _names(ident.cert_file)
    with pytest.raises(CertificateError, match="CN server"):
        issue(tmp_path, "cluster-a", "w1", audit, hostnames=["x.example.org"])
    assert main(["certs", "issue", str(tmp_path), "cluster-a", "server", "--hostname", "b.example.org",
                 "--audit", str(tmp_path / "audit.jsonl")]) == 0
    assert "b.example.org" in _names(ident.cert_file)


def test_a_key_never_leaves_its_host_request_sign_install(tmp_path: Path) -> None:
    """Host B makes a key and a CSR; A's CA signs the CSR alone; B installs the certificate."""
    ca_host, broker_host = tmp_path / "ca-host", tmp_path / "broker-host"
    init_certs(ca_host, ["cluster-a", "cluster-b"])
    # B's host has the trust bundle (CA certificates only, no CA key).
    (broker_host / "cluster-b").mkdir(parents=True)
    shutil.copy(ca_host / "cluster-b" / "trust.pem", broker_host / "cluster-b" / "trust.pem")
    csr = request(broker_host, "cluster-b", "server", hostnames=["broker-b.example.org", "10.0.0.7"])
    key_before = (csr.parent / "request.key").read_bytes()
    audit = AuditLog(tmp_path / "audit.jsonl")
    pem = sign(ca_host, "cluster-b", csr.read_bytes(), audit, server=True)  # only the CSR travelled
    ident = install(broker_host, "cluster-b", "server", pem)
    assert ident.key_file.read_bytes() == key_before and not (csr.parent / "request.key").exists()
    assert {"broker-b.example.org", "10.0.0.7", "localhost", "127.0.0.1"} <= _names(ident.cert_file)
    cert = x509.load_pem_x509_certificate(ident.cert_file.read_bytes())
    assert cert.issuer == ClusterCA(ca_host, "cluster-b").ensure_ca().subject
    assert not (broker_host / "cluster-b" / "ca.key").exists()
    assert [r["event"] for r in audit.records()] == ["cert_signed"]
    # A worker identity goes the same way, through the CLI.
    assert main(["certs", "request", str(broker_host), "cluster-b", "job.dec-0"]) == 0
    req = broker_host / "cluster-b" / "clients" / "job.dec-0" / "request.csr"
    out = tmp_path / "dec.pem"
    assert main(["certs", "sign", str(ca_host), "cluster-b", str(req), "--out", str(out),
                 "--audit", str(tmp_path / "audit.jsonl")]) == 0
    assert main(["certs", "install", str(broker_host), "cluster-b", "job.dec-0", str(out)]) == 0
    client = x509.load_pem_x509_certificate((req.parent / "cert.pem").read_bytes())
    assert client.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "job.dec-0"


def test_sign_and_install_refuse_what_they_must(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca_host, host = tmp_path / "ca", tmp_path / "host"
    init_certs(ca_host, ["cluster-a"])
    init_certs(host, ["cluster-a"])  # a CA of the same name that ca_host's bundle does not hold
    audit = AuditLog(tmp_path / "audit.jsonl")
    csr = request(host, "cluster-a", "w1")
    # An altered request (another public key under the same signature) is refused.
    other = request(host, "cluster-a", "w2").read_bytes()
    tampered = _swap_key(csr.read_bytes(), other)
    with pytest.raises(CertificateError, match="signature is invalid"):
        sign(ca_host, "cluster-a", tampered, audit)
    with pytest.raises(CertificateError, match="not a PEM certificate signing request"):
        sign(ca_host, "cluster-a", b"hello", audit)
    with pytest.raises(CertificateError, match="no CA key"):
        sign(tmp_path / "nowhere", "cluster-a", csr.read_bytes(), audit)
    pem = sign(ca_host, "cluster-a", csr.read_bytes(), audit)
    # ca_host's CA is not in host's trust bundle: refused until imported.
    with pytest.raises(CertificateError, match="not issued by a CA"):
        install(host, "cluster-a", "w1", pem)
    # A certificate for another key is refused.
    with pytest.raises(CertificateError, match="not for the pending key"):
        install(host, "cluster-a", "w2", pem)
    assert main(["certs", "install", str(host), "cluster-a", "w3", str(tmp_path / "missing.pem")]) == 1
    assert "missing.pem" in capsys.readouterr().err


def _swap_key(csr_pem: bytes, donor_pem: bytes) -> bytes:
    """``csr_pem`` with the public key of ``donor_pem`` spliced in (its signature no longer matches)."""
    csr, donor = x509.load_pem_x509_csr(csr_pem), x509.load_pem_x509_csr(donor_pem)
    der = csr.public_bytes(serialization.Encoding.DER)
    mine = csr.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    theirs = donor.public_key().public_bytes(serialization.Encoding.DER,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)
    assert len(mine) == len(theirs) and mine in der
    spliced = der.replace(mine, theirs)
    import base64

    body = base64.encodebytes(spliced).decode().replace("\n", "")
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return ("-----BEGIN CERTIFICATE REQUEST-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE REQUEST-----\n").encode()
