"""Rotating a broker's certificate revokes its old serial as a client's rotation does, and the
chaos runner knows the ``rotate`` fault (worker and broker certificates replaced mid-run)."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509

from nebula_mq.chaos import Fault
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.certs import ClusterCA, init_certs
from nebula_mq.security.lifecycle import list_certs, rotate


def _serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def test_rotating_the_broker_certificate_keeps_its_names_and_revokes_the_old_serial(tmp_path: Path) -> None:
    init_certs(tmp_path, ["cluster-a"])
    ca = ClusterCA(tmp_path, "cluster-a")
    old = _serial(ca.server().cert_file)
    audit = AuditLog(tmp_path / "audit.jsonl")
    new = rotate(tmp_path, "cluster-a", "server", audit, hostnames=["broker-a.example.org"])
    assert _serial(new.cert_file) != old
    crl = x509.load_pem_x509_crl((ca.dir / "crl.pem").read_bytes())
    assert crl.get_revoked_certificate_by_serial_number(old) is not None
    (rec,) = list(audit.records())
    assert rec["event"] == "cert_rotated" and rec["cn"] == "server" and rec["old_revoked"] is True
    assert {r.name: r.status for r in list_certs(tmp_path)}["server"] == "valid"
    names = x509.load_pem_x509_certificate(new.cert_file.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert {"localhost", "cluster-a", "broker-a.example.org"} <= set(names)


def test_rotate_without_revoking_keeps_the_old_serial_valid(tmp_path: Path) -> None:
    init_certs(tmp_path, ["cluster-a"], [("cluster-a", "w1")])
    ca = ClusterCA(tmp_path, "cluster-a")
    old = _serial(ca.client("w1").cert_file)
    rotate(tmp_path, "cluster-a", "w1", AuditLog(tmp_path / "audit.jsonl"), revoke_old=False)
    assert old not in ca.revoked_serials()


def test_the_rotate_fault_describes_itself() -> None:
    assert Fault(40, "rotate", "head-0").describe() == "step 40: certificate rotation head-0"
