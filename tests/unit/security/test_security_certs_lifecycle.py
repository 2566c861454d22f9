"""Certificate lifecycle without a broker: issue, rotate, revoke (CRL contents), list, CA exchange, audit."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509

from nebula_mq.cli import main
from nebula_mq.errors import CertificateError
from nebula_mq.security.audit import AuditLog, verify_chain
from nebula_mq.security.certs import ClusterCA, import_peer_ca, init_certs
from nebula_mq.security.lifecycle import issue, list_certs, revoke_cert, rotate
from nebula_mq.security.revocation import crl_dir, ensure_crls, issuer_hash


def _serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def _crl(ca: ClusterCA) -> x509.CertificateRevocationList:
    return x509.load_pem_x509_crl((ca.dir / "crl.pem").read_bytes())


def test_revoke_publishes_a_signed_crl_under_the_issuer_hash(tmp_path: Path) -> None:
    cas = init_certs(tmp_path, ["cluster-a", "cluster-b"], [("cluster-a", "w1")])
    out = ensure_crls(tmp_path, cas.values())
    ca = cas["cluster-a"]
    assert len(list(_crl(ca))) == 0 and (out / f"{issuer_hash(ca.dir / 'crl.pem')}.r0").exists()
    audit = AuditLog(tmp_path / "audit.jsonl")
    serial = revoke_cert(tmp_path, "cluster-a", "w1", audit)
    crl = _crl(ca)
    assert crl.get_revoked_certificate_by_serial_number(serial) is not None
    assert crl.is_signature_valid(ca.ensure_ca().public_key())
    assert crl.next_update_utc > dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=20)
    assert (crl_dir(tmp_path) / f"{issuer_hash(ca.dir / 'crl.pem')}.r0").read_bytes() == (ca.dir / "crl.pem").read_bytes()
    # A revoked certificate is never kept: the next issue gives a new serial.
    new = issue(tmp_path, "cluster-a", "w1", audit)
    assert _serial(new.cert_file) != serial
    assert [r["event"] for r in audit.records()] == ["cert_revoked", "cert_issued"]


def test_rotate_gives_a_new_key_and_revokes_the_old_serial(tmp_path: Path) -> None:
    init_certs(tmp_path, ["cluster-a"], [("cluster-a", "w1")])
    ca = ClusterCA(tmp_path, "cluster-a")
    old_serial, old_key = _serial(ca.client("w1").cert_file), ca.client("w1").key_file.read_bytes()
    audit = AuditLog(tmp_path / "audit.jsonl")
    ident = rotate(tmp_path, "cluster-a", "w1", audit)
    assert _serial(ident.cert_file) != old_serial and ident.key_file.read_bytes() != old_key
    assert _crl(ca).get_revoked_certificate_by_serial_number(old_serial) is not None
    (rec,) = list(audit.records())
    assert rec["event"] == "cert_rotated" and rec["old_serial"] == str(old_serial) and rec["old_revoked"]
    rotate(tmp_path, "cluster-a", "server", audit)
    assert verify_chain(audit.path).records == 2


def test_list_shows_status_and_warns_about_expiry(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    init_certs(tmp_path, ["cluster-a"], [("cluster-a", "w1"), ("cluster-a", "w2")])
    revoke_cert(tmp_path, "cluster-a", "w2", AuditLog(tmp_path / "a.jsonl"))
    rows = {r.name: r for r in list_certs(tmp_path)}
    assert rows["w1"].status == "valid" and rows["w2"].status == "revoked" and rows["ca"].days_left > 3000
    import nebula_mq.security.lifecycle as lifecycle
    monkeypatch.setattr(lifecycle, "WARN_BEFORE", dt.timedelta(days=3000))  # leaves (825 days) now "expire soon"
    assert main(["certs", "list", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "warning: cluster-a/w1 expiring" in captured.err and "nebula-mq certs rotate" in captured.err
    assert "warning: cluster-a/ca" not in captured.err


def test_ca_exchange_between_separate_hosts(tmp_path: Path) -> None:
    a = init_certs(tmp_path / "host-a", ["cluster-a"])["cluster-a"]
    b = init_certs(tmp_path / "host-b", ["cluster-b"])["cluster-b"]
    assert b"BEGIN CERTIFICATE" in a.trust_file.read_bytes() and a.trust_file.read_bytes().count(b"BEGIN") == 1
    import_peer_ca(a, "cluster-b", b.ca_cert_file.read_bytes())
    assert b.ca_cert_file.read_bytes() in a.trust_file.read_bytes()
    a.write_trust([])  # a later `certs init` keeps the imported CA
    assert a.trust_file.read_bytes().count(b"BEGIN CERTIFICATE") == 2
    with pytest.raises(CertificateError, match="not a CA"):
        import_peer_ca(a, "cluster-c", a.ensure_client("w1").cert_file.read_bytes())
    with pytest.raises(CertificateError, match="not a PEM CA"):
        import_peer_ca(a, "cluster-c", b"garbage")


def test_cli_revoke_unknown_identity_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    init_certs(tmp_path, ["cluster-a"])
    assert main(["certs", "revoke", str(tmp_path), "cluster-a", "ghost", "--audit", str(tmp_path / "a")]) == 1
    assert "no certificate for 'ghost'" in capsys.readouterr().err
    assert main(["certs", "issue", str(tmp_path), "cluster-z", "w", "--audit", str(tmp_path / "a")]) == 1
    assert "no CA for cluster 'cluster-z'" in capsys.readouterr().err
