"""The settings schema shared by every job: job identity, clusters, codecs, transport.

Scenario-specific sections (``[abnet]``, ``[electra]``) are kept as raw tables
here and validated by the scenario's own dataclass with :func:`nebula_mq.config.build`,
so the library stays free of role-specific logic. A job file holds the section of its own
scenario only (``[job] scenario``, ``abnet`` by default): another scenario's section is refused.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nebula_mq import config
from nebula_mq.config import InvalidField
from nebula_mq.errors import ConfigError

_JOB_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# Where a worker computes (``nebula_mq.models.device``): cpu, gpu (this rank's), gpu:N, auto.
DEVICE_PATTERN = re.compile(r"^(cpu|gpu|gpu:\d+|auto)$")


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
    ca_file: str = ""
    # The worker's own client certificate (its identity at the broker); required when tls is true.
    cert_file: str = ""
    # The private key of cert_file; required when tls is true.
    key_file: str = ""
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
    management_password_file: str = ""

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
    # The name its server certificate carries (`nebula-mq certs issue-server --hostname`); "" = host.
    server_name: str = ""
    # On this broker's own host: the directory holding its federation client identity (trust.pem,
    # cert.pem, key.pem, issued for CN federation-<cluster>), readable by the broker.
    cert_dir: str = "/etc/rabbitmq/certs/federation"

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


@dataclass(frozen=True)
class CodecSettings:
    # Chain for activations sent forward, e.g. "fp16(svd(0.6))"; "none" sends raw.
    forward: str = "fp16(svd(0.6))"
    # Chain for gradients sent back.
    backward: str = "int8"
    # Paper Figure 10: send uncompressed until this step, then use the chains.
    compress_from_step: int = 0
    # NaN/Inf tensors are refused by default; true lets them through the codecs.
    allow_non_finite: bool = False

    def validate(self) -> None:
        if self.compress_from_step < 0:
            raise InvalidField("compress_from_step", "a step >= 0", self.compress_from_step)
        from nebula_mq.codecs import parse_codec  # numpy-only; checked at load time
        from nebula_mq.errors import CodecError

        for name in ("forward", "backward"):
            try:
                parse_codec(getattr(self, name))
            except CodecError as exc:
                raise InvalidField(name, f"a codec chain like 'fp16(svd(0.6))' ({exc})",
                                   getattr(self, name)) from None


@dataclass(frozen=True)
class TransportSettings:
    # Unacked deliveries per consumer; keep ~2-4x bandwidth-delay product / message size.
    prefetch: int = 4
    # Cap of each bounded (sending-side) queue; full => publisher nack => wait and retry.
    max_queue_bytes: int = 256 * 1024 * 1024
    # How long a producer keeps retrying a nacked publish before failing loudly.
    publish_patience_s: float = 3600.0
    # Publishes in flight per publisher, waiting for the broker's confirm (delivery tags match
    # them). 1 = one confirm round trip each.
    publish_window: int = 64
    # Bytes of those publishes in flight (one larger message still goes, alone).
    publish_window_bytes: int = 64 * 1024 * 1024
    # Largest envelope accepted on decode (RabbitMQ's own default cap is 128 MiB).
    max_message_bytes: int = 96 * 1024 * 1024
    # Most bytes one envelope may decode to, every tensor and intermediate array counted
    # (0 = 4 x max_message_bytes): a malformed or hostile frame cannot exhaust memory.
    max_decoded_bytes: int = 0
    # A dead-letter queue holding more messages than this raises an alarm (a log error, the
    # nebula_dead_letter_alarm gauge, a line in `nebula-mq status`). The queue itself is never
    # capped: a condemned message is evidence, and every one is in the audit log too.
    dead_letter_alarm: int = 100

    @property
    def decoded_bytes_cap(self) -> int:
        return self.max_decoded_bytes or 4 * self.max_message_bytes

    def validate(self) -> None:
        if self.max_decoded_bytes < 0:
            raise InvalidField("max_decoded_bytes", "a number of bytes >= 0 (0: 4 x max_message_bytes)",
                               self.max_decoded_bytes)
        if self.prefetch < 1:
            raise InvalidField("prefetch", "an integer >= 1", self.prefetch)
        if self.dead_letter_alarm < 1:
            raise InvalidField("dead_letter_alarm", "a number of messages >= 1", self.dead_letter_alarm)
        if self.publish_window < 1:
            raise InvalidField("publish_window", "an integer >= 1", self.publish_window)
        if self.publish_window_bytes < 1:
            raise InvalidField("publish_window_bytes", "a number of bytes >= 1", self.publish_window_bytes)
        if self.max_queue_bytes < 1024 * 1024:
            raise InvalidField("max_queue_bytes", "at least 1 MiB (1048576)", self.max_queue_bytes)


@dataclass(frozen=True)
class SecuritySettings:
    # AES-GCM over every envelope, so a broker operator cannot read tensors (HMAC is always on).
    encrypt_payloads: bool = False
    # Messages signed longer ago than this (or before the job's key incarnation) are replays.
    replay_window_s: float = 24 * 3600.0

    def validate(self) -> None:
        if self.replay_window_s <= 0:
            raise InvalidField("replay_window_s", "a number of seconds > 0", self.replay_window_s)


@dataclass(frozen=True)
class JobSettings:
    # Lower-case slug; every queue, exchange, vhost and user name derives from it.
    id: str
    # Names the subpackage of ``workers`` that plans and runs the job (``workers.registry``).
    scenario: Literal["abnet", "electra", "split"] = "abnet"
    # Seeds data order, initialisation and dropout (every draw is a function of the seed and the step).
    seed: int = 0
    # Optimisation steps to train.
    steps: int = 100
    # Where checkpoints, metrics, logs and reports of this job go.
    run_dir: str = ""  # "" = run/jobs/<id>: jobs never share a directory by default
    # Also serve this worker's metrics over HTTP at /metrics on this port (0 = only the
    # textfile). Per process: `nebula-mq worker --metrics-port` sets it for the one it starts.
    metrics_port: int = 0
    # Where every worker computes, unless its role overrides it (``[abnet]``/``[split]``
    # head_device / tail_device): cpu, gpu (each rank its own), gpu:N, or auto (a GPU when
    # paddle sees one, else the CPU).
    device: str = "auto"
    # Also write each worker's per-step values as TensorBoard event files under
    # <run_dir>/tensorboard/<worker> (tensorboardX).
    tensorboard: bool = True

    def validate(self) -> None:
        if not DEVICE_PATTERN.match(self.device):
            raise InvalidField("device", "cpu, gpu, gpu:N or auto", self.device)
        if not _JOB_ID.match(self.id):
            raise InvalidField("id", f"a slug matching {_JOB_ID.pattern}", self.id)
        if self.steps < 1:
            raise InvalidField("steps", "an integer >= 1", self.steps)
        if not 0 <= self.metrics_port < 65536:
            raise InvalidField("metrics_port", "0 (off) or a port number", self.metrics_port)


@dataclass(frozen=True)
class Settings:
    job: JobSettings
    clusters: Mapping[str, ClusterSettings] = field(default_factory=dict)
    codec: CodecSettings = field(default_factory=CodecSettings)
    transport: TransportSettings = field(default_factory=TransportSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)
    # Scenario sections, validated by the scenario that reads them.
    abnet: Mapping[str, Any] = field(default_factory=dict)
    electra: Mapping[str, Any] = field(default_factory=dict)
    split: Mapping[str, Any] = field(default_factory=dict)
    # Path of the file these settings came from ("" when built in code).
    source: str = ""

    @property
    def run_dir(self) -> Path:
        return Path(self.job.run_dir or f"run/jobs/{self.job.id}")

    def scenario_section(self) -> Mapping[str, Any]:
        return getattr(self, self.job.scenario)


def load_settings(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> Settings:
    """Load a job file; ``NEBULA__SECTION__KEY`` environment variables override it.

    Only the keys of :class:`Settings` are accepted at the top level (``source`` is set here,
    never by the file), and a scenario section must be the one of ``[job] scenario``.
    """
    overrides = config.env_overrides(environ)
    data = config.apply_env_overrides(config.load_toml(path), environ)
    try:
        known = sorted(f.name for f in dataclasses.fields(Settings) if f.name != "source")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(str(path), unknown[0], f"one of {known}", "unknown key")
        data["source"] = str(path)
        # Cluster names default to their table key.
        for key, cluster in (data.get("clusters") or {}).items():
            if isinstance(cluster, dict):
                cluster.setdefault("name", key)
        settings = config.build(Settings, data, str(path))
        _check_scenario_sections(settings, data, overrides)
        return settings
    except ConfigError as exc:
        raise config.blame_env(exc, overrides) from None


def _check_scenario_sections(settings: Settings, data: Mapping[str, Any],
                             overrides: Sequence[config.EnvOverride]) -> None:
    """Refuse a scenario section (``[split]``, ``[abnet]``, ``[electra]``) that is not the section
    of the scenario in force: that job would run another scenario and ignore the section."""
    scenario = settings.job.scenario
    for section in typing.get_args(typing.get_type_hints(JobSettings)["scenario"]):
        if section == scenario or section not in data:
            continue
        job = data.get("job") or {}
        where = next((f"set by {o.variable}" for o in overrides if o.path == ("job", "scenario")),
                     "set in [job]" if "scenario" in job else "the default")
        raise ConfigError(settings.source, section,
                          f'[job] scenario = "{section}" to run a [{section}] section (the scenario '
                          f'in force is "{scenario}", {where}); set [job] scenario, or remove the section')
