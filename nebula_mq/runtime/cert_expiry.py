"""A worker's client certificate, ahead of its end: a log line, a status field, a gauge.

The broker checks a certificate's dates at the handshake only, so a worker runs on past its
certificate's ``notAfter`` until its next connection, which the broker then refuses (the
transport raises one ``CertificateError`` instead of retrying: ``transport.tls``). Before that
moment the worker says so: within ``[security] cert_warn_days`` of the end it logs one
``certificate_expiring`` warning at start and then at most once a day, with the command that
replaces the certificate, and its status carries ``cert_warning``. Its status always carries
``cert_expires_in_days`` and ``cert_not_after``, and its metrics the gauge
``nebula_certificate_expiry_timestamp_seconds``. The file is read again once it changes, so a
rotation (``nebula-mq certs rotate``) ends the warnings without a restart.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any, final

from nebula_mq.errors import NebulaError
from nebula_mq.runtime.logs import get_logger
from nebula_mq.transport.identity import certificate_not_after, rotate_hint

log = get_logger(__name__)

# The least time between two warnings about the same certificate.
WARN_EVERY_S = 24 * 3600.0


@final
class CertificateExpiry:
    """Watches one client certificate file; :meth:`fields` is called with each status write."""

    def __init__(self, cert_file: str, warn_days: float, clock: Callable[[], float] = time.time) -> None:
        self.cert_file = cert_file
        self.warn_days = warn_days
        self._clock = clock
        self._warned_at: float | None = None  # clock time of the last warning
        self.not_after: dt.datetime | None = None  # as last read

    def fields(self) -> dict[str, Any]:
        """The status fields (none while the file cannot be read: reporting never stops a
        worker); logs the warning when it is due."""
        try:
            end = certificate_not_after(self.cert_file)
        except NebulaError:
            return {}
        now = self._clock()
        if end != self.not_after:  # a new certificate: its own warnings, from the start
            self.not_after, self._warned_at = end, None
        days = (end.timestamp() - now) / 86400
        out: dict[str, Any] = {"cert_expires_in_days": round(days, 3), "cert_not_after": end.isoformat()}
        if days < self.warn_days or days <= 0:
            out["cert_warning"] = self.warning(end, days)
            if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                self._log(end, days, out["cert_warning"])
        return out

    def warning(self, end: dt.datetime, days: float) -> str:
        when = f"{end:%Y-%m-%d %H:%M} UTC"
        what = (f"expired on {when}: the open connections go on, the next one is refused" if days <= 0
                else f"expires in {days:.1f} days ({when})")
        return f"client certificate {self.cert_file} {what}: run `{rotate_hint(self.cert_file)}`"

    def _log(self, end: dt.datetime, days: float, message: str) -> None:
        emit = log.error if days <= 0 else log.warning
        emit("certificate_expired" if days <= 0 else "certificate_expiring", cert_file=self.cert_file,
             not_after=end.isoformat(), days_left=round(days, 2), warn_days=self.warn_days, hint=message)
