"""Connection events from a broker's log, copied into the audit log.

A refused connection never reaches nebula-mq code (the broker closes it during
the TLS handshake or the AMQP login), so the broker's own log is the only
witness. :class:`BrokerLogAuditor` reads the lines a node appended since the
last scan (a byte offset kept in a cursor file) and records one audit event per
connection outcome. Patterns are those RabbitMQ 3.10.8 / OTP 25 writes, checked
against real refusals (tests/integration/test_security_connections.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from nebula_mq.security.audit import AuditLog

# TLS alert text (as Erlang's ssl logs it) -> why the connection was refused.
TLS_ALERTS = {
    "Unexpected Message": "not_tls",  # a plaintext client: its first bytes are no TLS record
    "Protocol Version": "tls_version_too_old",
    "Certificate required": "no_client_certificate",
    "Handshake Failure": "handshake_failure",
    "Bad Certificate": "untrusted_certificate",
    "Unknown CA": "untrusted_certificate",
    "Certificate Revoked": "certificate_revoked",
    "Certificate Expired": "certificate_expired",
}

_TLS = re.compile(r"TLS server: In state (\S+) at \S+ generated SERVER ALERT: Fatal - (.+?)\s*$")
_LOGIN = re.compile(r"(\w+) login refused: user '([^']*)' - (.+?)\s*$")
_VHOST = re.compile(r"access to vhost '([^']*)' refused for user '([^']*)'")
_OK = re.compile(r"user '([^']*)' authenticated and granted access to vhost '([^']*)'")
_CHAN = re.compile(r"vhost: '([^']*)', user: '([^']*)'\), channel")
_DENIED = re.compile(r"operation (\S+) caused a channel exception access_refused: (.+?)\s*$")


class BrokerLogAuditor:
    """Scans one node's log file into ``audit``; ``cursor`` remembers how far it read."""

    def __init__(self, log_file: str | os.PathLike[str], audit: AuditLog, cluster: str,
                 cursor: str | os.PathLike[str]) -> None:
        self.log_file = Path(log_file)
        self.audit = audit
        self.cluster = cluster
        self.cursor = Path(cursor)

    def _offset(self) -> int:
        try:
            return int(self.cursor.read_text())
        except (OSError, ValueError):
            return 0

    def skip_to_end(self) -> None:
        """Start auditing from now on (ignore what the log already holds)."""
        self.cursor.write_text(str(self.log_file.stat().st_size))

    def scan(self) -> list[dict[str, Any]]:
        """Record and return the connection events written since the last scan."""
        start = self._offset()
        try:
            with open(self.log_file, "rb") as fh:
                if fh.seek(0, os.SEEK_END) < start:
                    start = 0  # the log was rotated
                fh.seek(start)
                data = fh.read()
        except FileNotFoundError:
            return []
        # Only whole lines; a line being written is read next time.
        end = data.rfind(b"\n") + 1
        events = parse_lines(data[:end].decode("utf-8", "replace").splitlines())
        for ev in events:
            fields = dict(ev)
            self.audit.record(fields.pop("event"), cluster=self.cluster, **fields)
        self.cursor.write_text(str(start + end))
        return events


def parse_lines(lines: list[str]) -> list[dict[str, Any]]:
    """Connection events in broker log lines (each: event, reason, details)."""
    out: list[dict[str, Any]] = []
    channel: tuple[str, str] | None = None
    for line in lines:
        stamp = line[:32].strip()
        if m := _TLS.search(line):
            alert = m.group(2)
            out.append({"event": "connection_refused", "layer": "tls", "broker_time": stamp,
                        "reason": TLS_ALERTS.get(alert, "tls_alert"), "alert": alert, "state": m.group(1)})
        elif m := _LOGIN.search(line):
            out.append({"event": "connection_refused", "layer": "amqp", "broker_time": stamp,
                        "reason": "login_refused", "user": m.group(2), "detail": m.group(3)})
        elif m := _VHOST.search(line):
            out.append({"event": "connection_refused", "layer": "amqp", "broker_time": stamp,
                        "reason": "vhost_refused", "vhost": m.group(1), "user": m.group(2)})
        elif m := _OK.search(line):
            out.append({"event": "connection_accepted", "broker_time": stamp, "user": m.group(1),
                        "vhost": m.group(2)})
        elif m := _CHAN.search(line):
            channel = (m.group(1), m.group(2))
        elif (m := _DENIED.search(line)) and channel is not None:
            out.append({"event": "permission_denied", "broker_time": stamp, "vhost": channel[0],
                        "user": channel[1], "operation": m.group(1), "detail": m.group(2)})
            channel = None
    return out
