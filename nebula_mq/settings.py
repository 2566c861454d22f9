"""The settings schema shared by every job: job identity, clusters (``[clusters.<name>]``: how a
worker reaches its local broker, and how the other clusters' brokers reach it), codecs, transport.

Every other top-level table of a job file is a scenario's section (``[abnet]``, ``[split]``...),
kept raw in :attr:`Settings.sections` and validated by the scenario's own dataclass with
:func:`nebula_mq.config.build`, so the library names no scenario and holds no role-specific logic.
Which sections exist is the scenarios' registry's to say (``workers.registry``, a layer above):
it loads job files with the declared names, and a job file then holds the section of its own
scenario only (``[job] scenario``, ``abnet`` by default).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from nebula_mq import config
from nebula_mq.config import PATH, InvalidField, require
from nebula_mq.errors import ConfigError

_JOB_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# Where a worker computes (``nebula_mq.models.device``): cpu, gpu (this rank's), gpu:N, auto.
DEVICE_PATTERN = re.compile(r"^(cpu|gpu|gpu:\d+|auto)$")
#: The brokers' ``max_message_size`` (RabbitMQ's default, 128 MiB): ``nebula_mq.stack`` renders it
#: into every node's rabbitmq.conf, and no job's ``[transport] max_message_bytes`` may exceed it (a
#: larger publish would make the broker close the channel).
BROKER_MAX_MESSAGE_BYTES = 128 * 1024 * 1024


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
        require(self, "port", 0 < self.port < 65536, "a port in 1..65535")
        require(self, "management_port", 0 <= self.management_port < 65536, "a port in 1..65535, or 0 for none")
        require(self, "management_user",
                not self.management_port or (self.management_user and self.management_password_file),
                "a user and a management_password_file (management_port is set)")
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
        require(self, "port", 0 < self.port < 65536, "a port in 1..65535")
        require(self, "host", not self.host or re.match(r"^[A-Za-z0-9.:\[\]-]+$", self.host),
                "a hostname or an IP address")
        require(self, "cert_dir", not self.cert_dir or self.cert_dir.startswith("/"),
                "an absolute path on the broker's host")


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
        require(self, "compress_from_step", self.compress_from_step >= 0, "a step >= 0")
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
    # Largest envelope sent or accepted: a larger one is refused before it is published, naming
    # a codec that would fit. At most the brokers' max_message_size, 134217728 (128 MiB).
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
        require(self, "max_message_bytes", 1 <= self.max_message_bytes <= BROKER_MAX_MESSAGE_BYTES,
                f"a number of bytes in 1..{BROKER_MAX_MESSAGE_BYTES} (the brokers' max_message_size, 128 MiB)")
        require(self, "max_decoded_bytes", self.max_decoded_bytes >= 0,
                "a number of bytes >= 0 (0: 4 x max_message_bytes)")
        require(self, "prefetch", self.prefetch >= 1, "an integer >= 1")
        require(self, "dead_letter_alarm", self.dead_letter_alarm >= 1, "a number of messages >= 1")
        require(self, "publish_window", self.publish_window >= 1, "an integer >= 1")
        require(self, "publish_window_bytes", self.publish_window_bytes >= 1, "a number of bytes >= 1")
        require(self, "max_queue_bytes", self.max_queue_bytes >= 1024 * 1024, "at least 1 MiB (1048576)")


@dataclass(frozen=True)
class SecuritySettings:
    # AES-GCM over every envelope, so a broker operator cannot read tensors (HMAC is always on).
    encrypt_payloads: bool = False
    # Messages signed longer ago than this (or before the job's key incarnation) are replays.
    replay_window_s: float = 24 * 3600.0
    # A worker whose client certificate expires within this many days says so: a log warning at
    # start and then once a day, its status (and `nebula-mq status`), and the gauge
    # nebula_certificate_expiry_timestamp_seconds. 0 = only once it has expired.
    cert_warn_days: float = 14.0

    def validate(self) -> None:
        require(self, "replay_window_s", self.replay_window_s > 0, "a number of seconds > 0")
        require(self, "cert_warn_days", self.cert_warn_days >= 0, "a number of days >= 0")


@dataclass(frozen=True)
class JobSettings:
    # Lower-case slug; every queue, exchange, vhost and user name derives from it.
    id: str
    # The scenario that plans and runs the job, one of those declared in ``workers.registry`` (a
    # subpackage of ``workers``); its section is the table of the same name.
    scenario: str = "abnet"
    # Seeds data order, initialisation and dropout (every draw is a function of the seed and the step).
    seed: int = 0
    # Optimisation steps to train.
    steps: int = 100
    # Where checkpoints, metrics, logs and reports of this job go (relative to the job file;
    # "" = run/jobs/<id> under the current directory: jobs never share a directory by default).
    run_dir: str = field(default="", metadata=PATH)
    # Also serve this worker's metrics over HTTP at /metrics on this port (0 = only the
    # textfile). Per process: `nebula-mq worker --metrics-port` sets it for the one it starts.
    metrics_port: int = 0
    # Where every worker computes, unless its role overrides it (``[abnet]``/``[split]``
    # head_device / tail_device): cpu, gpu (each rank its own), gpu:N, or auto (a GPU when
    # the side's framework sees one, else the CPU).
    device: str = "auto"
    # Also write each worker's per-step values as TensorBoard event files under
    # <run_dir>/tensorboard/<worker> (tensorboardX).
    tensorboard: bool = True

    def validate(self) -> None:
        require(self, "device", DEVICE_PATTERN.match(self.device), "cpu, gpu, gpu:N or auto")
        require(self, "id", _JOB_ID.match(self.id), f"a slug matching {_JOB_ID.pattern}")
        require(self, "steps", self.steps >= 1, "an integer >= 1")
        require(self, "metrics_port", 0 <= self.metrics_port < 65536, "0 (off) or a port number")


@dataclass(frozen=True, init=False)
class Settings:
    job: JobSettings
    clusters: Mapping[str, ClusterSettings] = field(default_factory=dict)
    codec: CodecSettings = field(default_factory=CodecSettings)
    transport: TransportSettings = field(default_factory=TransportSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)
    # Scenario sections by name (every other top-level table), validated by the scenario that reads them.
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Path of the file these settings came from ("" when built in code).
    source: str = ""

    def __init__(self, job: JobSettings, clusters: Mapping[str, ClusterSettings] | None = None,
                 codec: CodecSettings | None = None, transport: TransportSettings | None = None,
                 security: SecuritySettings | None = None, sections: Mapping[str, Mapping[str, Any]] | None = None,
                 source: str = "", **named_sections: Mapping[str, Any]) -> None:
        """``Settings(job=..., split={...})`` puts ``[split]`` in :attr:`sections` (over one there)."""
        values = {"job": job, "clusters": {} if clusters is None else clusters, "codec": codec or CodecSettings(),
                  "transport": transport or TransportSettings(), "security": security or SecuritySettings(),
                  "sections": MappingProxyType({**(sections or {}), **named_sections}), "source": source}
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def run_dir(self) -> Path:
        return Path(self.job.run_dir or f"run/jobs/{self.job.id}")

    def section(self, name: str) -> Mapping[str, Any]:
        """The ``[name]`` section as written (empty when the job has none)."""
        return self.sections.get(name, MappingProxyType({}))

    def scenario_section(self) -> Mapping[str, Any]:
        return self.section(self.job.scenario)


CORE_KEYS = tuple(f.name for f in dataclasses.fields(Settings) if f.name not in ("sections", "source"))


def _relative_to(folder: Path, data: dict[str, Any], sections: Callable[[str], type | None] | None,
                 ) -> dict[str, Any]:
    """A job file's tables with the relative paths written there made relative to ``folder``,
    the file's own: the core tables by :class:`Settings`' schema, a scenario section by the
    schema ``sections`` gives for it (none: kept as written)."""
    out = config.resolve_paths(Settings, data, folder)
    for name, table in data.items():
        schema = sections(name) if sections is not None and name not in CORE_KEYS else None
        if schema is not None and isinstance(table, dict):
            out[name] = config.resolve_paths(schema, table, folder)
    return out


def load_settings(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None, *,
                  scenarios: Collection[str] | None = None,
                  sections: Callable[[str], type | None] | None = None) -> Settings:
    """Load a job file; ``NEBULA__SECTION__KEY`` environment variables override it.

    The :data:`CORE_KEYS` tables are validated here; any other top-level table is a scenario
    section, kept as written. With the declared ``scenarios`` (``workers.registry.load_job_settings``
    passes them: load job files there) the file is checked against them too: ``[job] scenario``
    names one, every other top-level key is one's section, and only the scenario in force's.
    Relative paths written in the file are made relative to its folder (``config.resolve_paths``),
    in the core tables and in each scenario section whose schema ``sections`` gives.
    """
    overrides = config.env_overrides(environ)
    data = config.apply_env_overrides(_relative_to(Path(path).resolve().parent, config.load_toml(path), sections),
                                      environ)
    try:
        extra = sorted(set(data) - set(CORE_KEYS))
        if scenarios is not None:
            unknown = [k for k in extra if k not in scenarios]
            expected = f"one of {sorted({*CORE_KEYS, *scenarios})}"
        else:  # no scenario named here: any table may be one's section
            unknown = [k for k in extra if not isinstance(data[k], Mapping)]
            expected = f"one of {sorted(CORE_KEYS)} or a scenario's section"
        if unknown:
            raise ConfigError(str(path), unknown[0], expected, "unknown key")
        for key in extra:
            if not isinstance(data[key], Mapping):
                raise ConfigError(str(path), key, "a table", data[key])
        # Cluster names default to their table key.
        for key, cluster in (data.get("clusters") or {}).items():
            if isinstance(cluster, dict):
                cluster.setdefault("name", key)
        core = {k: v for k, v in data.items() if k in CORE_KEYS}
        settings = config.build(Settings, {**core, "sections": {k: data[k] for k in extra}, "source": str(path)},
                                str(path))
        if scenarios is not None:
            _check_scenario(settings, data, overrides, sorted(scenarios))
        return settings
    except ConfigError as exc:
        raise config.blame_env(exc, overrides) from None


def _check_scenario(settings: Settings, data: Mapping[str, Any], overrides: Sequence[config.EnvOverride],
                    scenarios: Sequence[str]) -> None:
    """Refuse a scenario that is not declared, and a section of another scenario than the one in
    force: that job would run another scenario and ignore the section."""
    scenario = settings.job.scenario
    if scenario not in scenarios:
        raise ConfigError(settings.source, "job.scenario", f"one of {list(scenarios)}", scenario)
    for section in sorted(settings.sections):
        if section == scenario:
            continue
        job = data.get("job") or {}
        where = next((f"set by {o.variable}" for o in overrides if o.path == ("job", "scenario")),
                     "set in [job]" if "scenario" in job else "the default")
        raise ConfigError(settings.source, section,
                          f'[job] scenario = "{section}" to run a [{section}] section (the scenario '
                          f'in force is "{scenario}", {where}); set [job] scenario, or remove the section')
