"""Certificates for identities whose private key must not leave its host: request, sign, install.

1. ``request`` on the host that will use the identity: a new key (mode 0600) and a
   certificate signing request, kept beside the identity's files (``request.key``,
   ``request.csr``). Only the CSR travels.
2. ``sign`` on the host that holds the CA: checks the request's own signature, keeps its CN
   and (for a broker) its DNS and IP names, and signs with the cluster's CA.
   Only the certificate travels back.
3. ``install`` on the first host: the certificate must be for the pending key and issued
   by a CA of the cluster's trust bundle; then it and the key replace the identity's
   ``cert.pem`` and ``key.pem``.

The identity's directory is the one :class:`~nebula_mq.security.certs.ClusterCA` uses
(``DIR/<cluster>/server`` for CN ``server``, ``DIR/<cluster>/clients/<cn>`` otherwise),
so brokers, workers and ``certs list`` find the result where they always look.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nebula_mq.errors import CertificateError
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.certs import ClusterCA, Identity, alt_names, general_names, split_names
from nebula_mq.security.pem import key_matches, key_pem, load_key, new_key, signed_by, write_private, write_public

SERVER = "server"


def request(certs_dir: str | os.PathLike[str], cluster: str, cn: str, hostnames: Sequence[str] = ()) -> Path:
    """Make a key and a CSR for ``cn`` (``server``: the broker, with ``hostnames`` as SANs);
    returns the CSR's path. A new request replaces an older pending one."""
    ca = ClusterCA(certs_dir, cluster)
    ident = ca.identity(cn)
    if cn != SERVER and hostnames:
        raise CertificateError("--hostname is for a broker's certificate (CN server)")
    key = new_key()
    subject_cn = cluster if cn == SERVER else cn
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
    if cn == SERVER:
        alt_names = general_names(*split_names(["localhost", cluster, *hostnames]))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    csr = builder.sign(key, hashes.SHA256())
    folder = ident.cert_file.parent
    write_private(folder / "request.key", key_pem(key))
    write_public(folder / "request.csr", csr.public_bytes(serialization.Encoding.PEM))
    return folder / "request.csr"


def sign(certs_dir: str | os.PathLike[str], cluster: str, csr_pem: bytes, audit: AuditLog,
         server: bool = False) -> bytes:
    """Sign a CSR with ``cluster``'s CA; returns the certificate (PEM). The request must carry
    a valid signature (its sender holds the key) and a CN of our form; a broker's request
    (``server``) keeps its DNS/IP names."""
    ca = ClusterCA(certs_dir, cluster)
    if not ca.ca_key_file.is_file():
        raise CertificateError(f"no CA key for cluster {cluster!r} in {certs_dir}: sign on the host that holds it")
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError:
        raise CertificateError("not a PEM certificate signing request") from None
    if not csr.is_signature_valid:
        raise CertificateError("the request's signature is invalid (it was altered, or made without its key)")
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise CertificateError("the request's key is not an EC key (make it with `nebula-mq certs request`)")
    cns = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cns) != 1:
        raise CertificateError("the request must name exactly one CN")
    cn = str(cns[0].value)
    dns, ips = alt_names(csr) if server else ([], [])
    cert = ca.sign(cn, key, server=server, dns=dns, ips=ips)
    audit.record("cert_signed", cluster=cluster, cn=cn, serial=str(cert.serial_number), server=server,
                 names=[*dns, *ips])
    return cert.public_bytes(serialization.Encoding.PEM)


def install(certs_dir: str | os.PathLike[str], cluster: str, cn: str, cert_pem: bytes) -> Identity:
    """Put a signed certificate in place with its pending key (from ``request``)."""
    ca = ClusterCA(certs_dir, cluster)
    ident = ca.identity(cn)
    folder = ident.cert_file.parent
    key = load_key(folder / "request.key")
    if key is None:
        raise CertificateError(f"no pending request for {cluster}/{cn} in {folder} (run `nebula-mq certs request`)")
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise CertificateError("not a PEM certificate") from None
    if not key_matches(cert, key):
        raise CertificateError(f"this certificate is not for the pending key of {cluster}/{cn}")
    if not any(signed_by(cert, ca_cert) for ca_cert in _trusted(ca)):
        raise CertificateError(f"this certificate was not issued by a CA in {ca.trust_file}: import that CA "
                               f"first (`nebula-mq certs import-ca`)")
    write_private(ident.key_file, key_pem(key))
    write_public(ident.cert_file, cert_pem)
    (folder / "request.key").unlink()
    (folder / "request.csr").unlink(missing_ok=True)
    return ident


def _trusted(ca: ClusterCA) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(ca.trust_file.read_bytes())
    except (OSError, ValueError):
        raise CertificateError(f"no trust bundle {ca.trust_file} (run `nebula-mq certs init` or `import-ca`)") from None
