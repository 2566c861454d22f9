"""Certificate lifecycle: issue, rotate, revoke, list (with expiry warnings); every event audited.

Rotation without losing in-flight messages: messages live in durable queues,
not in connections, and an established TLS connection is not re-checked. A
rotation writes a new key and certificate and revokes the old serial, so the
worker keeps its open connection (and its unacked deliveries) until it
reconnects, and the next connection must present the new certificate (the
transport reads its identity files at every handshake, ``transport.tls``).
Brokers read certificate files at every handshake (``bypass_pem_cache``), so a
rotated *server* certificate also applies to the next connection without a
restart; its old serial goes into the CRL too, as a record: nothing checks a
broker's certificate against a CRL (workers and federation links verify it
against the CA bundle only).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nebula_mq.errors import CertificateError
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.certs import ClusterCA, Identity, sans
from nebula_mq.security.pem import load_cert
from nebula_mq.security.revocation import revoke

# A certificate closer to its end than this is listed with a warning.
WARN_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class CertInfo:
    cluster: str
    # "server", "ca", or the client CN.
    name: str
    serial: int
    not_after: dt.datetime
    # valid | expiring | expired | revoked
    status: str
    path: Path

    @property
    def days_left(self) -> float:
        return (self.not_after - dt.datetime.now(dt.timezone.utc)).total_seconds() / 86400


def _ca(certs_dir: str | os.PathLike[str], cluster: str) -> ClusterCA:
    ca = ClusterCA(certs_dir, cluster)
    if not ca.ca_cert_file.exists():
        raise CertificateError(f"no CA for cluster {cluster!r} in {certs_dir} (run `nebula-mq certs init`)")
    return ca


def _serial(ident: Identity) -> int | None:
    cert = load_cert(ident.cert_file)
    return None if cert is None else cert.serial_number


def issue(certs_dir: str | os.PathLike[str], cluster: str, cn: str, audit: AuditLog,
          hostnames: Sequence[str] = ()) -> Identity:
    """Issue (or keep, while valid and not revoked) ``cn``'s certificate from ``cluster``'s CA:
    a client's, or with ``cn = "server"`` the broker's, whose names then include ``hostnames``
    (the names peers and workers reach it by)."""
    ca = _ca(certs_dir, cluster)
    names = _broker_names(ca, cn, hostnames)
    before = _serial(ca.identity(cn))
    ident = ca.ensure_client(cn) if names is None else ca.ensure_server(names)
    after = _serial(ident)
    if after != before:
        audit.record("cert_issued", cluster=cluster, cn=cn, serial=str(after), names=list(hostnames))
    return ident


def _broker_names(ca: ClusterCA, cn: str, hostnames: Sequence[str]) -> list[str] | None:
    """The names a broker's certificate gets from :func:`issue` or :func:`rotate`: those its
    current certificate carries, kept, and ``hostnames``; None for a client's (``cn`` other
    than ``"server"``), which takes no hostnames."""
    if cn != "server":
        if hostnames:
            raise CertificateError("--hostname is for a broker's certificate (CN server)")
        return None
    cert = load_cert(ca.server().cert_file)
    return [*(sorted(sans(cert)) if cert is not None else []), *hostnames]


def rotate(certs_dir: str | os.PathLike[str], cluster: str, cn: str, audit: AuditLog,
           revoke_old: bool = True, hostnames: Sequence[str] = ()) -> Identity:
    """New key and certificate for ``cn`` (``"server"`` for the broker, keeping its names and
    adding ``hostnames``); the old serial is revoked unless ``revoke_old`` is false."""
    ca = _ca(certs_dir, cluster)
    names = _broker_names(ca, cn, hostnames)
    old = _serial(ca.identity(cn))
    ident = ca.ensure_client(cn, force=True) if names is None else ca.ensure_server(names, force=True)
    revoked = old is not None and revoke_old
    if revoked:
        revoke(certs_dir, ca, cn, serial=old)
    audit.record("cert_rotated", cluster=cluster, cn=cn, old_serial=str(old), serial=str(_serial(ident)),
                 old_revoked=revoked)
    return ident


def revoke_cert(certs_dir: str | os.PathLike[str], cluster: str, cn: str, audit: AuditLog) -> int:
    """Revoke ``cn``'s current certificate; refused at its next connection."""
    serial = revoke(certs_dir, _ca(certs_dir, cluster), cn)
    audit.record("cert_revoked", cluster=cluster, cn=cn, serial=str(serial))
    return serial


def list_certs(certs_dir: str | os.PathLike[str]) -> list[CertInfo]:
    """Every CA, server and client certificate under ``certs_dir`` with its status."""
    now = dt.datetime.now(dt.timezone.utc)
    out = []
    for d in sorted(p for p in Path(certs_dir).iterdir() if (p / "ca.pem").is_file()):
        ca = ClusterCA(certs_dir, d.name)
        revoked = ca.revoked_serials()
        files = [("ca", ca.ca_cert_file), ("server", ca.server().cert_file)]
        files += [(c.name, c / "cert.pem") for c in sorted((d / "clients").glob("*")) if c.is_dir()]
        for name, path in files:
            cert = load_cert(path)
            if cert is None:
                continue
            end = cert.not_valid_after_utc
            status = ("revoked" if cert.serial_number in revoked else "expired" if end <= now
                      else "expiring" if end - now < WARN_BEFORE else "valid")
            out.append(CertInfo(d.name, name, cert.serial_number, end, status, path))
    return out
