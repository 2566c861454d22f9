"""Certificate revocation: one CRL per cluster CA, published where the brokers look.

Every broker runs with ``ssl_options.crl_check = peer`` and Erlang's
``ssl_crl_hash_dir`` CRL cache (``broker/advanced.config.template``). That cache
reads ``DIR/crl/<issuer-hash>.r0`` from disk at each handshake, so a revocation
takes effect at the next connection, without a broker restart. ``<issuer-hash>``
is OpenSSL's subject-name hash of the CA (``openssl crl -hash``; Erlang's
``public_key:short_name_hash`` computes the same value).

Every CA always has a CRL, empty or not: with ``crl_check`` a peer whose issuer
has no CRL is refused. CRLs are valid for ``CRL_DAYS`` and re-signed by every
``ensure_crls`` (``stack up``) and every revocation.

Layout, next to the certificates of ``nebula_mq.security.certs``::

    DIR/<cluster>/revoked.json     serial -> {cn, revoked_at} of this CA's revoked certificates
    DIR/<cluster>/crl.pem          the CA's current CRL
    DIR/crl/<hash>.r0              copies of every cluster's CRL, named for the broker's cache
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from nebula_mq.errors import CertificateError
from nebula_mq.security.certs import ClusterCA
from nebula_mq.security.pem import load_cert, write_public

CRL_DAYS = 30


def crl_dir(certs_dir: str | os.PathLike[str]) -> Path:
    """The directory every broker's CRL cache reads (made if missing)."""
    out = Path(certs_dir) / "crl"
    out.mkdir(parents=True, exist_ok=True)
    return out


def issuer_hash(crl_pem: Path) -> str:
    """OpenSSL's subject hash of the CRL's issuer (the name Erlang's hash-dir cache looks up)."""
    try:
        out = subprocess.run(["openssl", "crl", "-hash", "-noout", "-in", str(crl_pem)],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise CertificateError(f"cannot hash CRL {crl_pem} with openssl: {exc}") from None
    return out.stdout.strip().splitlines()[0]


def write_crl(ca: ClusterCA, publish_to: Path) -> Path:
    """Sign ``ca``'s CRL (valid CRL_DAYS) and publish it into ``publish_to``; returns the CRL file."""
    ca_cert, ca_key = ca.keypair()
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - dt.timedelta(minutes=5))
        .next_update(now + dt.timedelta(days=CRL_DAYS))
    )
    for serial, info in sorted(ca.revoked_serials().items()):
        when = dt.datetime.fromisoformat(info["revoked_at"])
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build())
    crl = builder.sign(ca_key, hashes.SHA256())
    pem = crl.public_bytes(serialization.Encoding.PEM)
    crl_file = ca.dir / "crl.pem"
    write_public(crl_file, pem)
    write_public(publish_to / f"{issuer_hash(crl_file)}.r0", pem)
    ca.restaple()  # the broker's certificate carries it to the peers (security.trust)
    return crl_file


def ensure_crls(certs_dir: str | os.PathLike[str], cas: Iterable[ClusterCA]) -> Path:
    """Fresh CRLs for every CA in the brokers' CRL directory; returns that directory."""
    out = crl_dir(certs_dir)
    for ca in cas:
        write_crl(ca, out)
    return out


def revoke(certs_dir: str | os.PathLike[str], ca: ClusterCA, cn: str, serial: int | None = None) -> int:
    """Revoke client ``cn``'s certificate (its current one, or ``serial``); returns the serial.

    The certificate files stay (so ``list`` can show them as revoked); the next
    ``ensure_client(cn)`` issues a new certificate with a new serial.
    """
    if serial is None:
        cert = load_cert(ca.client(cn).cert_file)
        if cert is None:
            raise CertificateError(f"no certificate for {cn!r} on {ca.cluster} ({ca.client(cn).cert_file})")
        serial = cert.serial_number
    revoked = ca.revoked_serials()
    revoked[serial] = {"cn": cn, "revoked_at": dt.datetime.now(dt.timezone.utc).isoformat()}
    write_public(ca.revoked_file, json.dumps({str(k): v for k, v in revoked.items()}, indent=1).encode())
    write_crl(ca, crl_dir(certs_dir))
    return serial


def import_peer_crl(certs_dir: str | os.PathLike[str], ca: ClusterCA, peer: str, pem: bytes) -> Path:
    """Publish ``peer``'s CRL (received from the peer's host, ``certs export-crl``) where
    ``ca``'s broker looks. The brokers check every peer certificate against its issuer's CRL,
    so a peer's federation link is refused until its CRL is here, and again once it expires
    (``CRL_DAYS``): re-import it before then. It must be signed by the CA imported for
    ``peer`` (``certs import-ca``)."""
    peer_ca = load_cert(ca.dir / "peers" / f"{peer}.pem")
    if peer_ca is None:
        raise CertificateError(f"no CA imported for peer {peer!r} on {ca.cluster}: run `nebula-mq certs import-ca` first")
    try:
        crl = x509.load_pem_x509_crl(pem)
    except ValueError:
        raise CertificateError(f"the file offered as {peer!r}'s CRL is not a PEM CRL") from None
    if crl.issuer != peer_ca.subject or not crl.is_signature_valid(peer_ca.public_key()):  # type: ignore[arg-type]
        raise CertificateError(f"this CRL was not signed by {peer!r}'s CA")
    if crl.next_update_utc is not None and crl.next_update_utc <= dt.datetime.now(dt.timezone.utc):
        raise CertificateError(f"this CRL of {peer!r} expired on {crl.next_update_utc:%Y-%m-%d}: ask for a fresh one")
    kept = ca.dir / "peers" / f"{peer}.crl"
    write_public(kept, pem)
    write_public(crl_dir(certs_dir) / f"{issuer_hash(kept)}.r0", pem)
    return kept
