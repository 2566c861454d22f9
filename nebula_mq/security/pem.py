"""PEM files of keys and certificates: written atomically with the right mode, read leniently
(a missing or unreadable file is None: the caller issues a new one)."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from nebula_mq.atomic import atomic_writer, write_atomic


def write_private(path: Path, data: bytes, replace: bool = True) -> None:
    """Write ``data`` with mode 0600 from the first byte on, durably, then rename into place
    (``replace=False``: only where nothing is yet, else ``FileExistsError``)."""
    with atomic_writer(path, mode=0o600, fsync=True, replace=replace) as fh:
        fh.write(data)


def write_public(path: Path, data: bytes) -> None:
    write_atomic(path, data, mode=0o644)


def new_key() -> ec.EllipticCurvePrivateKey:
    # P-256: fast to generate, supported by Erlang/OTP 25 and Python's ssl.
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_cert(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None


def load_key(path: Path) -> ec.EllipticCurvePrivateKey | None:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def key_matches(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    return cert.public_key() == key.public_key()
