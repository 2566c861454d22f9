"""Certificates of a nebula-mq deployment: one CA per cluster, exchanged as trust bundles.

Layout under the certificate directory (``DIR``)::

    DIR/<cluster>/ca.pem, ca.key           the cluster's own CA
    DIR/<cluster>/trust.pem                 CAs this cluster's broker and clients trust:
                                            its own CA plus every peer cluster's CA
    DIR/<cluster>/server/cert.pem, key.pem  the broker's server certificate
    DIR/<cluster>/clients/<cn>/cert.pem, key.pem
                                            client identities issued by this cluster's CA
                                            (workers, and the broker's federation client)

A client identity's CN is the RabbitMQ user name it logs in as (EXTERNAL auth,
``ssl_cert_login_from = common_name``). A broker verifies the *peer* broker's
federation client certificate, which the peer's CA issued, so each broker's
``cacertfile`` is the trust bundle, not only its own CA.

Everything is idempotent: a certificate is kept while it is valid for at least
``RENEW_BEFORE`` more and was signed by the current CA; otherwise it is reissued.
Private keys are created with mode 0600 and written atomically.

What a certificate contains: a CA certificate is self-signed, valid ``CA_DAYS``, a CA of path
length 0 that signs certificates and CRLs. A leaf is valid ``LEAF_DAYS`` (never past its CA),
for server or client authentication, with its CN and, for a server, the DNS names and IP
addresses it answers to. Both are backdated five minutes, for clocks a little apart.

A broker's (server) certificate also carries its CA's current CRL (:data:`STAPLED_CRL`, an
extension no TLS stack acts on: a non-critical one it ignores), so the CRL travels in every
TLS handshake with the broker, signed by the CA, and a peer that trusts the CA can read it from
the handshake (``security.trust``): the trust between two clusters needs no file carried.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nebula_mq.errors import CertificateError
from nebula_mq.security.pem import (key_matches, key_pem, load_cert, load_key, new_key, signed_by, write_private,
                                   write_public)

# A certificate expiring sooner than this is reissued by the next ``ensure_*`` call.
RENEW_BEFORE = dt.timedelta(days=30)
CA_DAYS = 3650
LEAF_DAYS = 825
#: The extension of a broker certificate that holds its CA's CRL (DER); a UUID OID (X.667).
STAPLED_CRL = x509.ObjectIdentifier("2.25.323460692032263884951902349600893135982")

#: A cluster name or a certificate CN (which is also a directory name and a RabbitMQ user name).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_BACKDATE = dt.timedelta(minutes=5)


def check_name(name: str, what: str) -> str:
    if not NAME.match(name):
        raise CertificateError(f"{what} must match {NAME.pattern}, got {name!r}")
    return name


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def ca_certificate(cluster: str, key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    """The self-signed certificate of ``cluster``'s CA, whose key is ``key``."""
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nebula-mq"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"nebula-mq CA {cluster}"),
        ]
    )
    start = now()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - _BACKDATE)
        .not_valid_after(start + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def leaf_certificate(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, cluster: str, cn: str,
                     public_key: ec.EllipticCurvePublicKey, *, server: bool, dns: Sequence[str] = (),
                     ips: Sequence[str] = (), crl: bytes | None = None) -> x509.Certificate:
    """A certificate for ``cn`` (of ``cluster``) and ``public_key``, signed by the CA ``ca_cert``;
    ``crl``: the CA's CRL (DER) a broker's certificate carries (:data:`STAPLED_CRL`)."""
    start = now()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"nebula-mq {cluster}"),
            x509.NameAttribute(NameOID.COMMON_NAME, check_name(cn, "certificate CN")),
        ]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - _BACKDATE)
        .not_valid_after(min(start + dt.timedelta(days=LEAF_DAYS), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if dns or ips:
        builder = builder.add_extension(x509.SubjectAlternativeName(general_names(dns, ips)), critical=False)
    if crl is not None:
        builder = builder.add_extension(x509.UnrecognizedExtension(STAPLED_CRL, crl), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def stapled_crl(cert: x509.Certificate) -> bytes | None:
    """The CRL (DER) a broker's certificate carries, if any."""
    try:
        value = cert.extensions.get_extension_for_oid(STAPLED_CRL).value
    except x509.ExtensionNotFound:
        return None
    return value.value if isinstance(value, x509.UnrecognizedExtension) else None


def general_names(dns: Sequence[str], ips: Sequence[str]) -> list[x509.GeneralName]:
    """The subjectAltName entries of DNS names ``dns`` and IP addresses ``ips``."""
    return [*(x509.DNSName(n) for n in dict.fromkeys(dns)), *(x509.IPAddress(ipaddress.ip_address(i)) for i in ips)]


def split_names(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) of ``names``, 127.0.0.1 always among the addresses."""
    dns: list[str] = []
    ips = ["127.0.0.1"]
    for n in names:
        try:
            ips.append(str(ipaddress.ip_address(n)))
        except ValueError:
            dns.append(n)
    return list(dict.fromkeys(dns)), list(dict.fromkeys(ips))


def alt_names(cert: x509.Certificate | x509.CertificateSigningRequest) -> tuple[list[str], list[str]]:
    """The DNS names and the IP addresses ``cert`` (or a request) names in its subjectAltName."""
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    return list(ext.get_values_for_type(x509.DNSName)), [str(i) for i in ext.get_values_for_type(x509.IPAddress)]


def sans(cert: x509.Certificate) -> set[str]:
    """The DNS names and IP addresses ``cert`` is valid for."""
    dns, ips = alt_names(cert)
    return {*dns, *ips}


def federation_identity(cluster: str) -> str:
    """CN (and RabbitMQ user name) of ``cluster``'s broker when it acts as a federation client."""
    return f"federation-{cluster}"


@dataclass(frozen=True)
class Identity:
    """Files of one certificate identity (a broker or a client)."""

    cn: str
    cert_file: Path
    key_file: Path
    # Bundle of CAs this identity trusts when verifying its peer.
    ca_file: Path


def _fresh(cert: x509.Certificate | None) -> bool:
    return cert is not None and cert.not_valid_after_utc - now() > RENEW_BEFORE


class ClusterCA:
    """The CA of one cluster and the identities it issues."""

    def __init__(self, root: str | os.PathLike[str], cluster: str) -> None:
        self.cluster = check_name(cluster, "cluster name")
        self.dir = Path(root) / cluster
        self.ca_cert_file = self.dir / "ca.pem"
        self.ca_key_file = self.dir / "ca.key"
        self.trust_file = self.dir / "trust.pem"

    # ------------------------------------------------------------------ the CA itself

    def ensure_ca(self) -> x509.Certificate:
        """Load the CA, creating (or replacing an expiring) one; returns its certificate."""
        cert, key = load_cert(self.ca_cert_file), load_key(self.ca_key_file)
        if cert is not None and key is not None and _fresh(cert) and key_matches(cert, key):
            return cert
        key = new_key()
        cert = ca_certificate(self.cluster, key)
        write_private(self.ca_key_file, key_pem(key))
        write_public(self.ca_cert_file, cert.public_bytes(serialization.Encoding.PEM))
        return cert

    def keypair(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """This cluster's CA certificate and key (what signs its certificates and CRLs, and seals
        and signs for it: ``security.keys``), made if needed."""
        cert = self.ensure_ca()
        key = load_key(self.ca_key_file)
        if key is None:
            raise CertificateError(f"{self.ca_key_file}: unreadable CA key")
        return cert, key

    def peer_ca(self, peer: str) -> x509.Certificate:
        """The CA certificate of cluster ``peer`` as this cluster trusts it: imported from the peer's
        host (``certs import-ca``), or the peer's own CA when both live in this certs root."""
        for path in (self.dir / "peers" / f"{check_name(peer, 'peer cluster')}.pem",
                     self.dir.parent / peer / "ca.pem"):
            cert = load_cert(path)
            if cert is not None:
                return cert
        raise CertificateError(f"cluster {self.cluster} does not trust a CA of {peer!r} yet: "
                               f"import it (`nebula-mq certs import-ca ... {self.cluster} {peer} {peer}-ca.pem`)")

    # ------------------------------------------------------------------ leaves

    def server(self) -> Identity:
        d = self.dir / "server"
        return Identity(self.cluster, d / "cert.pem", d / "key.pem", self.trust_file)

    def identity(self, cn: str) -> Identity:
        """The files of ``cn``: ``"server"`` is this cluster's broker, any other CN a client."""
        return self.server() if cn == "server" else self.client(cn)

    def client(self, cn: str) -> Identity:
        d = self.dir / "clients" / check_name(cn, "client identity")
        return Identity(cn, d / "cert.pem", d / "key.pem", self.trust_file)

    def ensure_server(self, hostnames: Sequence[str] = (), force: bool = False) -> Identity:
        """Server certificate with SANs localhost, 127.0.0.1, the cluster name and ``hostnames``
        (DNS names or IP addresses); ``force``: a new key and certificate now (rotation)."""
        dns, ips = split_names(["localhost", self.cluster, *hostnames])
        ident = self.server()
        self._ensure_leaf(ident, server=True, dns=dns, ips=ips, force=force)
        return ident

    def ensure_client(self, cn: str, force: bool = False) -> Identity:
        """Client certificate whose CN is the RabbitMQ user name ``cn``; ``force``: a new key and
        certificate now (rotation)."""
        ident = self.client(cn)
        self._ensure_leaf(ident, server=False, dns=[], ips=[], force=force)
        return ident

    @property
    def revoked_file(self) -> Path:
        return self.dir / "revoked.json"

    def revoked_serials(self) -> dict[int, dict[str, str]]:
        """serial -> {cn, revoked_at} of the certificates this CA revoked (``security.revocation``)."""
        try:
            raw = json.loads(self.revoked_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise CertificateError(f"{self.revoked_file}: unreadable revocation list ({exc})") from None
        return {int(k): v for k, v in raw.items()}

    def _ensure_leaf(self, ident: Identity, *, server: bool, dns: Sequence[str], ips: Sequence[str],
                     force: bool = False) -> None:
        ca_cert = self.ensure_ca()
        cert, key = load_cert(ident.cert_file), load_key(ident.key_file)
        if (
            not force and cert is not None and key is not None and _fresh(cert)
            and cert.serial_number not in self.revoked_serials()
            and signed_by(cert, ca_cert) and key_matches(cert, key)
            and (not server or sans(cert) >= set(dns) | set(ips))
        ):
            return
        key = new_key()
        cert = self.sign(ident.cn, key.public_key(), server=server, dns=dns, ips=ips)
        write_private(ident.key_file, key_pem(key))
        write_public(ident.cert_file, cert.public_bytes(serialization.Encoding.PEM))

    def sign(self, cn: str, public_key: ec.EllipticCurvePublicKey, *, server: bool, dns: Sequence[str] = (),
             ips: Sequence[str] = ()) -> x509.Certificate:
        """A leaf certificate for ``cn`` and ``public_key``, signed by this CA (issue, rotate, and
        ``certs sign`` of a request whose key never left its host); a broker's carries the
        CA's current CRL (:data:`STAPLED_CRL`)."""
        ca_cert, ca_key = self.keypair()
        return leaf_certificate(ca_cert, ca_key, self.cluster, cn, public_key, server=server, dns=dns, ips=ips,
                                crl=self.crl_der() if server else None)

    def crl_der(self) -> bytes | None:
        """This CA's current CRL, DER (None before ``revocation.write_crl`` made one)."""
        try:
            return x509.load_pem_x509_crl((self.dir / "crl.pem").read_bytes()).public_bytes(serialization.Encoding.DER)
        except (OSError, ValueError):
            return None

    def restaple(self) -> None:
        """The broker's certificate signed again (its key and names kept) when the CRL it carries
        is not this CA's current one: a revocation reaches the peers with the next handshake."""
        ident = self.server()
        cert, key = load_cert(ident.cert_file), load_key(ident.key_file)
        crl = self.crl_der()
        if cert is None or key is None or crl is None or stapled_crl(cert) == crl:
            return
        dns, ips = split_names(sorted(sans(cert)))
        renewed = self.sign(ident.cn, key.public_key(), server=True, dns=dns, ips=ips)
        write_public(ident.cert_file, renewed.public_bytes(serialization.Encoding.PEM))

    def write_trust(self, peers: Iterable[ClusterCA]) -> Path:
        """Trust bundle: this cluster's CA first, then each peer's CA, then imported peer CAs."""
        pems = [self.ensure_ca().public_bytes(serialization.Encoding.PEM)]
        pems += [p.ensure_ca().public_bytes(serialization.Encoding.PEM) for p in peers if p.cluster != self.cluster]
        # CAs of peer clusters on other hosts, received with `nebula-mq certs exchange --import`.
        for f in sorted((self.dir / "peers").glob("*.pem")):
            pem = f.read_bytes()
            if pem not in pems:
                pems.append(pem)
        data = b"".join(pems)
        if not self.trust_file.exists() or self.trust_file.read_bytes() != data:
            write_public(self.trust_file, data)
        return self.trust_file


def import_peer_ca(ca: ClusterCA, peer: str, pem: bytes) -> Path:
    """Trust ``peer``'s CA certificate (received out of band) on ``ca``'s cluster; rewrites the bundle."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except (ValueError, x509.ExtensionNotFound):
        raise CertificateError(f"the certificate offered for peer {peer!r} is not a PEM CA certificate") from None
    if not is_ca:
        raise CertificateError(f"the certificate offered for peer {peer!r} is not a CA (basicConstraints)")
    write_public(ca.dir / "peers" / f"{check_name(peer, 'peer cluster')}.pem",
                  cert.public_bytes(serialization.Encoding.PEM))
    local = [ClusterCA(ca.dir.parent, d.name) for d in sorted(ca.dir.parent.iterdir())
             if (d / "ca.key").is_file() and NAME.match(d.name)]
    return ca.write_trust(local)


def init_certs(
    root: str | os.PathLike[str],
    clusters: Sequence[str],
    identities: Iterable[tuple[str, str]] = (),
) -> dict[str, ClusterCA]:
    """Create (or keep) every cluster's CA, trust bundle, server and federation client certs.

    ``identities`` are extra ``(cluster, cn)`` client identities (workers).
    """
    if not clusters:
        raise CertificateError("at least one cluster is needed")
    cas = {c: ClusterCA(root, c) for c in clusters}
    for ca in cas.values():
        ca.ensure_ca()
    for ca in cas.values():
        ca.write_trust(cas.values())
        ca.ensure_server()
        ca.ensure_client(federation_identity(ca.cluster))
    for cluster, cn in identities:
        if cluster not in cas:
            raise CertificateError(f"identity {cn!r} names unknown cluster {cluster!r}")
        cas[cluster].ensure_client(cn)
    return cas
