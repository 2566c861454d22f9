"""Trusting a peer cluster in one step, from its broker: its CA pinned by fingerprint, its CRL
read from the handshake.

Each cluster has its own CA, and each broker checks every peer certificate against the
issuer's CA and CRL; so before two clusters' brokers federate, each must hold the other's CA
certificate and CRL. Neither is secret, but both must be the peer's own. The peer's broker
sends both in every TLS handshake: its certificate chain ends in its CA, and its certificate
carries the CA's current CRL (``certs.STAPLED_CRL``), both signed by that CA. So:

* ``nebula-mq stack up`` on a broker host prints the line to run on the peer's broker host:
  ``nebula-mq stack trust cluster-a a1.example.org:5671 --fingerprint sha256:...``, the
  fingerprint being that of its CA, read on the host that holds it;
* :func:`trust_peer` (that command) opens a TLS connection to the peer's broker, checks that
  the chain's CA has that fingerprint, that it is the CA of the cluster named, that it signed
  the broker's certificate and the CRL it carries, and imports both; the running broker
  reloads them at once;
* later, :func:`refresh_peer` (``nebula-mq up`` at start and every hour while it supervises,
  for each peer of the job) reads the same handshake again and takes the peer's newer CRL,
  checked against the CA already trusted, with no fingerprint: a revocation on one side
  reaches the other without anyone carrying a file, and a CRL never runs out mid-job.

The handshake is a client's that presents no certificate: the peer's broker refuses it once
it has sent its own chain, which is all this reads.
"""

from __future__ import annotations

import _ssl
import hashlib
import socket
import ssl
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from nebula_mq.errors import CertificateError
from nebula_mq.security.certs import ClusterCA, import_peer_ca, stapled_crl
from nebula_mq.security.revocation import import_peer_crl

TIMEOUT_S = 10.0


def fingerprint(cert: x509.Certificate) -> str:
    """``sha256:`` and the hex SHA-256 of ``cert``'s DER encoding."""
    return "sha256:" + hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def trust_line(ca: ClusterCA, host: str, port: int) -> str:
    """The command a peer's broker host runs to trust ``ca``'s cluster, whose broker it reaches
    at ``host:port``."""
    return f"nebula-mq stack trust {ca.cluster} {host}:{port} --fingerprint {fingerprint(ca.ensure_ca())}"


@dataclass(frozen=True)
class PeerChain:
    """What a peer's broker showed in its handshake: its CA and the CRL its certificate carries."""

    ca: x509.Certificate
    crl: x509.CertificateRevocationList
    where: str  # host:port, for messages


def read_chain(host: str, port: int, timeout: float = TIMEOUT_S) -> PeerChain:
    """The CA and CRL of the broker at ``host:port``, each checked against the other (the CA signed
    the broker's certificate and the CRL); not yet against anything this cluster trusts."""
    where = f"{host}:{port}"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # checked below, against the pinned fingerprint or the trusted CA
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            certs = [x509.load_der_x509_certificate(der) for der in _unverified_chain(tls)]
    except (OSError, ssl.SSLError) as exc:
        raise CertificateError(f"cannot read the certificates of the broker at {where}: {exc}") from None
    if not certs:
        raise CertificateError(f"the broker at {where} showed no certificate")
    leaf = certs[0]
    ca = next((c for c in certs[1:] if c.subject == c.issuer == leaf.issuer), None)
    if ca is None:
        raise CertificateError(f"the broker at {where} did not show the CA that signed its certificate")
    crl_der = stapled_crl(leaf)
    try:
        leaf.verify_directly_issued_by(ca)
        crl = x509.load_der_x509_crl(crl_der) if crl_der else None
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateError(f"the certificate of the broker at {where} is not signed by the CA it shows") from None
    if crl is None:
        raise CertificateError(f"the broker at {where} carries no CRL in its certificate (`nebula-mq stack up` "
                               f"there again brings it up to date)")
    if crl.issuer != ca.subject or not crl.is_signature_valid(ca.public_key()):  # type: ignore[arg-type]
        raise CertificateError(f"the CRL the broker at {where} carries is not signed by its CA")
    return PeerChain(ca, crl, where)


def _unverified_chain(tls: ssl.SSLSocket) -> list[bytes]:
    """The certificates the peer sent, leaf first, DER (``SSLSocket.get_unverified_chain`` from
    Python 3.13; the same method of the socket's ``_sslobj`` since 3.10)."""
    sslobj: Any = getattr(tls, "_sslobj", None)
    method = getattr(tls, "get_unverified_chain", None) or getattr(sslobj, "get_unverified_chain", None)
    if method is None:
        raise CertificateError("this Python cannot read a peer's certificate chain (3.10 or later is needed)")
    chain = method() or []
    return [c if isinstance(c, bytes) else c.public_bytes(_ssl.ENCODING_DER) for c in chain]


def trust_peer(ca: ClusterCA, peer: str, host: str, port: int, expected: str) -> PeerChain:
    """Make ``ca``'s cluster trust ``peer``, whose broker is at ``host:port`` and whose CA has the
    fingerprint ``expected`` (as ``trust_line`` printed it there)."""
    chain = read_chain(host, port)
    got = fingerprint(chain.ca)
    if got.lower() != expected.strip().lower():
        raise CertificateError(f"the CA of the broker at {chain.where} has fingerprint {got}, not {expected}: "
                               f"not trusted (a wrong host or port, or someone in between)")
    _check_named(chain, peer)
    _import(ca, peer, chain)
    return chain


def refresh_peer(ca: ClusterCA, peer: str, host: str, port: int) -> PeerChain:
    """The CRL of ``peer`` (already trusted) as its broker at ``host:port`` carries it now."""
    chain = read_chain(host, port)
    trusted = ca.peer_ca(peer)  # raises when the peer is not trusted yet: stack trust first
    if chain.ca.public_bytes(serialization.Encoding.DER) != trusted.public_bytes(serialization.Encoding.DER):
        raise CertificateError(f"the broker at {chain.where} shows a CA ({fingerprint(chain.ca)}) that is not the "
                               f"{peer} CA this cluster trusts ({fingerprint(trusted)})")
    _import(ca, peer, chain)
    return chain


def _check_named(chain: PeerChain, peer: str) -> None:
    names = [a.value for a in chain.ca.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)]
    if names != [f"nebula-mq CA {peer}"]:
        raise CertificateError(f"the broker at {chain.where} belongs to another cluster (its CA is {names[0] if names else '?'!r}, "
                               f"not cluster {peer}'s)")


def _import(ca: ClusterCA, peer: str, chain: PeerChain) -> None:
    import_peer_ca(ca, peer, chain.ca.public_bytes(serialization.Encoding.PEM))
    import_peer_crl(ca.dir.parent, ca, peer, chain.crl.public_bytes(serialization.Encoding.PEM))
