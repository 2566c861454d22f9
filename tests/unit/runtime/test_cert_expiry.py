"""A worker says ahead of time that its client certificate ends: one log warning at start and
then at most once a day within ``[security] cert_warn_days``, its status (``cert_expires_in_days``,
``cert_warning``), the gauge ``nebula_certificate_expiry_timestamp_seconds``, and a line of
``nebula-mq status``; a rotated certificate ends the warnings without a restart."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from nebula_mq.cli.status import certificate_warnings, worker_rows
from nebula_mq.errors import ConfigError
from nebula_mq.runtime.cert_expiry import WARN_EVERY_S, CertificateExpiry
from nebula_mq.runtime.reporter import Reporter
from nebula_mq.security.audit import AuditLog
from nebula_mq.security.lifecycle import rotate
from nebula_mq.settings import (BrokerSettings, ClusterSettings, JobSettings, SecuritySettings, Settings,
                                load_settings)
from tests.fixtures.short_certs import now, short_lived

A = "cluster-a"


class Clock:
    def __init__(self) -> None:
        self.t = now().timestamp()

    def __call__(self) -> float:
        return self.t


def _warnings(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [r for r in logs if str(r["event"]).startswith("certificate_")]


def test_within_the_window_it_warns_at_start_then_once_a_day(tmp_path: Path) -> None:
    ident = short_lived(tmp_path, A, "w1", now() + dt.timedelta(days=5))
    clock = Clock()
    watch = CertificateExpiry(str(ident.cert_file), warn_days=14, clock=clock)
    with capture_logs() as logs:
        first = watch.fields()
        clock.t += 3600
        watch.fields()
        clock.t += WARN_EVERY_S
        later = watch.fields()
    warned = _warnings(logs)
    assert [r["event"] for r in warned] == ["certificate_expiring", "certificate_expiring"]
    assert warned[0]["log_level"] == "warning" and 4.9 < float(str(warned[0]["days_left"])) <= 5.0
    assert f"nebula-mq certs rotate {tmp_path.resolve()} {A} w1" in str(warned[0]["hint"])
    assert 4.9 < first["cert_expires_in_days"] <= 5.0 and "expires in 5.0 days" in first["cert_warning"]
    assert later["cert_expires_in_days"] < first["cert_expires_in_days"] - 1


def test_outside_the_window_no_warning_only_the_date(tmp_path: Path) -> None:
    ident = short_lived(tmp_path, A, "w1", now() + dt.timedelta(days=30))
    with capture_logs() as logs:
        fields = CertificateExpiry(str(ident.cert_file), warn_days=14).fields()
    assert not _warnings(logs) and "cert_warning" not in fields
    assert 29.9 < fields["cert_expires_in_days"] <= 30.0
    assert dt.datetime.fromisoformat(fields["cert_not_after"]) > now()


def test_an_expired_certificate_is_an_error_line_even_with_the_window_off(tmp_path: Path) -> None:
    ident = short_lived(tmp_path, A, "w1", now() - dt.timedelta(hours=1))
    with capture_logs() as logs:
        fields = CertificateExpiry(str(ident.cert_file), warn_days=0).fields()
    (line,) = _warnings(logs)
    assert line["event"] == "certificate_expired" and line["log_level"] == "error"
    assert fields["cert_expires_in_days"] < 0 and "expired on" in fields["cert_warning"]


def test_a_rotation_ends_the_warnings_without_a_restart(tmp_path: Path) -> None:
    ident = short_lived(tmp_path, A, "w1", now() + dt.timedelta(days=2))
    watch = CertificateExpiry(str(ident.cert_file), warn_days=14)
    assert "cert_warning" in watch.fields()
    rotate(tmp_path, A, "w1", AuditLog(tmp_path / "audit.jsonl"))
    with capture_logs() as logs:
        fields = watch.fields()
    assert "cert_warning" not in fields and fields["cert_expires_in_days"] > 800 and not _warnings(logs)


def test_an_unreadable_file_costs_the_fields_never_the_worker(tmp_path: Path) -> None:
    assert CertificateExpiry(str(tmp_path / "missing.pem"), warn_days=14).fields() == {}


def _settings(tmp_path: Path, cert_file: str, tls: bool = True) -> Settings:
    broker = BrokerSettings(tls=tls, cert_file=cert_file)
    return Settings(job=JobSettings(id="cx", run_dir=str(tmp_path / "run"), tensorboard=False),
                    clusters={A: ClusterSettings(name=A, broker=broker)},
                    security=SecuritySettings(cert_warn_days=7))


def test_the_status_file_the_gauge_and_nebula_mq_status_show_it(tmp_path: Path) -> None:
    end = (now() + dt.timedelta(days=3)).replace(microsecond=0)
    ident = short_lived(tmp_path, A, "head-0-cn", end)
    settings = _settings(tmp_path, str(ident.cert_file))
    report = Reporter(settings, A, "head-0", "split-head")
    report.status("running")
    body = json.loads((settings.run_dir / "status" / "head-0.json").read_text())
    assert 2.9 < body["cert_expires_in_days"] <= 3.0 and "expires in" in body["cert_warning"]
    gauge = report.metrics.registry.get_sample_value(
        "nebula_certificate_expiry_timestamp_seconds",
        {"job": "cx", "worker": "head-0", "role": "split-head", "cluster": A})
    assert gauge == end.timestamp()
    rows = worker_rows(settings.run_dir)
    assert rows[0]["cert_expires_in_days"] == body["cert_expires_in_days"]
    (line,) = certificate_warnings(rows)
    assert line.startswith("CERTIFICATE head-0: client certificate ") and "nebula-mq certs rotate" in line


def test_without_tls_there_is_no_certificate_to_watch(tmp_path: Path) -> None:
    report = Reporter(_settings(tmp_path, "", tls=False), A, "w", "r")
    report.status("running")
    body = json.loads((tmp_path / "run" / "status" / "w.json").read_text())
    assert "cert_expires_in_days" not in body and report.certificate is None


def test_the_window_is_a_setting_of_its_own(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[job]\nid = "cx"\n[security]\ncert_warn_days = 30\n')
    assert load_settings(job, environ={}).security.cert_warn_days == 30
    job.write_text('[job]\nid = "cx"\n[security]\ncert_warn_days = -1\n')
    with pytest.raises(ConfigError, match="cert_warn_days"):
        load_settings(job, environ={})
    assert dataclasses.replace(SecuritySettings()).cert_warn_days == 14
