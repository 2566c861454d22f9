"""Who a connection logs in as: the user name the broker gives it.

With TLS the worker logs in by EXTERNAL auth and the broker takes the user name from its client
certificate's common name (``ssl_cert_login_from = common_name`` in the brokers' configuration,
``broker/rabbitmq.conf.template``); without TLS (a development broker) it is the configured
``username``. Dead letters carry that name as their AMQP ``user_id`` (``base.Transport.dead_letter``,
``consumer.RabbitDelivery.dead_letter``): RabbitMQ refuses a publish whose ``user_id`` is not the
connected user, so the property names the certificate that published the message.

A client certificate also ends: :func:`certificate_not_after` reads its ``notAfter`` (again
whenever the file changes, as after ``nebula-mq certs rotate``), and :func:`check_not_expired`
refuses to connect with an expired one, naming the file, the date and the command that replaces it.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from nebula_mq.errors import CertificateError, TransportError
from nebula_mq.settings import BrokerSettings


def _load(cert_file: str) -> x509.Certificate:
    try:
        with open(cert_file, "rb") as fh:
            return x509.load_pem_x509_certificate(fh.read())
    except (OSError, ValueError) as exc:
        raise TransportError(f"cannot read the client certificate {cert_file!r}: {exc}") from None


@functools.lru_cache(maxsize=64)
def certificate_cn(cert_file: str) -> str:
    """The common name of the first certificate in ``cert_file`` (PEM)."""
    cert = _load(cert_file)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise TransportError(f"client certificate {cert_file!r} has {len(names)} common names, expected one "
                             f"(the broker's user name)")
    return str(names[0].value)


def connection_user(broker: BrokerSettings) -> str:
    """The user name ``broker`` knows this client by: the certificate's CN with TLS, else ``username``."""
    return certificate_cn(broker.cert_file) if broker.tls else broker.username


@functools.lru_cache(maxsize=64)
def _not_after(cert_file: str, _stamp: tuple[int, int, int]) -> dt.datetime:
    return _load(cert_file).not_valid_after_utc


def certificate_not_after(cert_file: str) -> dt.datetime:
    """When the first certificate in ``cert_file`` (PEM) expires (UTC); read again once the
    file changes (its inode, size or modification time)."""
    try:
        st = os.stat(cert_file)
    except OSError as exc:
        raise TransportError(f"cannot read the client certificate {cert_file!r}: {exc}") from None
    return _not_after(cert_file, (st.st_ino, st.st_size, st.st_mtime_ns))


def rotate_hint(cert_file: str) -> str:
    """The command that gives ``cert_file`` a successor: exact where the file lies in a
    ``nebula-mq certs`` directory (``DIR/<cluster>/clients/<cn>/cert.pem``)."""
    path = Path(cert_file).resolve()
    if len(path.parents) >= 4 and path.parents[1].name == "clients":
        return f"nebula-mq certs rotate {path.parents[3]} {path.parents[2].name} {path.parent.name}"
    return "nebula-mq certs rotate DIR CLUSTER CN"


def check_not_expired(cert_file: str, now: dt.datetime | None = None) -> dt.datetime:
    """``cert_file``'s ``notAfter``; a ``CertificateError`` when that has passed: the broker
    would refuse the handshake at every attempt, so retrying cannot help."""
    end = certificate_not_after(cert_file)
    if end <= (now or dt.datetime.now(dt.timezone.utc)):
        raise CertificateError(f"client certificate {cert_file} expired on {end:%Y-%m-%d %H:%M} UTC: "
                               f"run `{rotate_hint(cert_file)}` and restart the worker")
    return end
