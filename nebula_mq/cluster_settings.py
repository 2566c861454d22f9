"""Where a job's clusters are: how a worker reaches its local broker, and how the other clusters'
brokers reach it (the ``[clusters.<name>]`` tables of a job file, read by :mod:`nebula_mq.settings`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nebula_mq.config import PATH, InvalidField


@dataclass(frozen=True)
class BrokerSettings:
    """How a worker reaches its *local* broker (never the remote one)."""

    # The local broker's address (`nebula-mq worker --stack` fills it from the stack).
    host: str = "127.0.0.1"
    # The local broker's AMQPS port (`nebula-mq worker --stack` fills it from the stack).
    port: int = 5671
    # The job's vhost (nebula-<job id>).
    vhost: str = "/"
    # TLS with client certificates (EXTERNAL auth); false only for a plaintext development broker.
    tls: bool = True
    # The CA bundle the broker's certificate must chain to; required when tls is true.
    ca_file: str = field(default="", metadata=PATH)
    # The worker's own client certificate (its identity at the broker); required when tls is true.
    cert_file: str = field(default="", metadata=PATH)
    # The private key of cert_file; required when tls is true.
    key_file: str = field(default="", metadata=PATH)
    # Name checked against the broker certificate (SNI + hostname check).
    server_name: str = "localhost"
    # The AMQP user, only for plaintext development brokers (tls = false); TLS uses EXTERNAL
    # auth (the client certificate names the user).
    username: str = "guest"
    # That user's password, only for plaintext development brokers (tls = false).
    password: str = "guest"
    # Seconds; pika's I/O thread answers heartbeats while compute runs elsewhere.
    heartbeat_s: int = 30
    # The broker's management API (HTTPS on `host`, same CA and client certificate as AMQP), read
    # with the job's read-only monitoring user: queue sizes in bytes for the metrics and the report.
    # 0 = no management API: queue depth comes from AMQP alone, in messages.
    management_port: int = 0
    # The job's read-only monitoring user on that API (required when management_port is set).
    management_user: str = ""
    # A file holding that user's password (never the password itself in the job file).
    management_password_file: str = field(default="", metadata=PATH)

    def validate(self) -> None:
        if not 0 < self.port < 65536:
            raise InvalidField("port", "a port in 1..65535", self.port)
        if not 0 <= self.management_port < 65536:
            raise InvalidField("management_port", "a port in 1..65535, or 0 for none", self.management_port)
        if self.management_port and not (self.management_user and self.management_password_file):
            raise InvalidField("management_user", "a user and a management_password_file (management_port is set)",
                               self.management_user)
        missing = [f for f in ("ca_file", "cert_file", "key_file") if not getattr(self, f)]
        if self.tls and missing:
            raise InvalidField(missing[0], "a file path (tls = true needs ca_file, cert_file and key_file)",
                               getattr(self, missing[0]))


@dataclass(frozen=True)
class FederationSettings:
    """How the *other* clusters' brokers reach this cluster's broker, and where this broker keeps
    its own federation client identity. Read by ``nebula-mq provision`` (the local stack fills
    its own)."""

    # The broker's address as peer brokers see it (a hostname, for a real deployment).
    host: str = ""
    # The broker's AMQPS port as peer brokers see it.
    port: int = 5671
    # The name its server certificate carries (`nebula-mq stack up --hostname`); "" = host.
    server_name: str = ""
    # On this broker's own host: the directory holding its federation client identity (trust.pem,
    # cert.pem, key.pem, issued for CN federation-<cluster>), readable by the broker.
    cert_dir: str = field(default="/etc/rabbitmq/certs/federation", metadata=PATH)

    @property
    def sni(self) -> str:
        return self.server_name or self.host

    def validate(self) -> None:
        if not 0 < self.port < 65536:
            raise InvalidField("port", "a port in 1..65535", self.port)
        if self.host and not re.match(r"^[A-Za-z0-9.:\[\]-]+$", self.host):
            raise InvalidField("host", "a hostname or an IP address", self.host)
        if self.cert_dir and not self.cert_dir.startswith("/"):
            raise InvalidField("cert_dir", "an absolute path on the broker's host", self.cert_dir)


@dataclass(frozen=True)
class ClusterSettings:
    name: str
    # How this cluster's workers reach their own broker.
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    # How the other clusters' brokers reach this one (nebula-mq provision).
    federation: FederationSettings = field(default_factory=FederationSettings)

    @property
    def names_broker(self) -> bool:
        """Whether the job file says how to reach this cluster's broker (a ``[clusters.<name>.broker]``
        table), not only how the peers reach it (``federation``)."""
        return self.broker != BrokerSettings()
