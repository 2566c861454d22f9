"""What nebula-mq's certificates contain: a cluster CA's own certificate, the leaves it signs,
and the names they carry.

A broker's (server) certificate also carries its CA's current CRL (:data:`STAPLED_CRL`, an
extension no TLS stack acts on: a non-critical one it ignores), so the CRL travels in every
TLS handshake with the broker, signed by the CA, and a peer that trusts the CA can read it from
the handshake (``security.trust``): the trust between two clusters needs no file carried.

A CA certificate is self-signed, valid ``CA_DAYS``, a CA of path length 0 that signs
certificates and CRLs. A leaf is valid ``LEAF_DAYS`` (never past its CA), for server or
client authentication, with its CN and, for a server, the DNS names and IP addresses it
answers to. Both are backdated five minutes, for clocks a little apart. Where the files lie
and when to issue again is ``certs.ClusterCA``'s business.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nebula_mq.errors import CertificateError

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
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys(dns)]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
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


def sans(cert: x509.Certificate) -> set[str]:
    """The DNS names and IP addresses ``cert`` is valid for."""
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(ext.get_values_for_type(x509.DNSName)) | {str(i) for i in ext.get_values_for_type(x509.IPAddress)}
