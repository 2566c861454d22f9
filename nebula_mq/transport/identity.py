"""Who a connection logs in as: the user name the broker gives it.

With TLS the worker logs in by EXTERNAL auth and the broker takes the user name from its client
certificate's common name (``ssl_cert_login_from = common_name`` in the brokers' configuration,
``broker/rabbitmq.conf.template``); without TLS (a development broker) it is the configured
``username``. Dead letters carry that name as their AMQP ``user_id`` (``base.Transport.dead_letter``,
``consumer.RabbitDelivery.dead_letter``): RabbitMQ refuses a publish whose ``user_id`` is not the
connected user, so the property names the certificate that published the message.
"""

from __future__ import annotations

import functools

from cryptography import x509
from cryptography.x509.oid import NameOID

from nebula_mq.errors import TransportError
from nebula_mq.settings import BrokerSettings


@functools.lru_cache(maxsize=64)
def certificate_cn(cert_file: str) -> str:
    """The common name of the first certificate in ``cert_file`` (PEM)."""
    try:
        with open(cert_file, "rb") as fh:
            cert = x509.load_pem_x509_certificate(fh.read())
    except (OSError, ValueError) as exc:
        raise TransportError(f"cannot read the client certificate {cert_file!r}: {exc}") from None
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise TransportError(f"client certificate {cert_file!r} has {len(names)} common names, expected one "
                             f"(the broker's user name)")
    return str(names[0].value)


def connection_user(broker: BrokerSettings) -> str:
    """The user name ``broker`` knows this client by: the certificate's CN with TLS, else ``username``."""
    return certificate_cn(broker.cert_file) if broker.tls else broker.username
