"""``nebula-mq status`` says when a broker blocks a worker's publishers (a memory or disk alarm),
from the status files and from the status feed (``broker_alarm``, ``broker_alarm_reason``, written
by ``runtime.reporter``), and, from the feed too, when a client certificate nears its end."""

from __future__ import annotations

import json
import os
from pathlib import Path

from nebula_mq.cli.status import broker_alarms, certificate_warnings, with_alarms, worker_rows


def _status(run_dir: Path, worker: str, state: str, **extra: object) -> None:
    (run_dir / "status").mkdir(parents=True, exist_ok=True)
    body = {"worker": worker, "role": "abnet-decoder", "cluster": "cluster-b", "job": "st", "pid": os.getpid(),
            "state": state, "step": 3, "updated": 0.0, "values": {}, **extra}
    (run_dir / "status" / f"{worker}.json").write_text(json.dumps(body))


def test_a_blocked_live_worker_raises_one_alarm_line_per_cluster_and_reason(tmp_path: Path) -> None:
    blocked = {"broker_alarm": "cluster-b", "broker_alarm_reason": "low on memory"}
    _status(tmp_path, "dec-1", "running", **blocked)
    _status(tmp_path, "dec-0", "running", **blocked)
    _status(tmp_path, "dec-2", "running")
    _status(tmp_path, "old", "stopped", broker_alarm="cluster-b", broker_alarm_reason="low on disk")
    rows = worker_rows(tmp_path)
    assert {r["worker"]: r["broker_alarm_reason"] for r in rows}["dec-0"] == "low on memory"
    assert broker_alarms(rows) == ["ALARM cluster-b: low on memory (publishing blocked: dec-0, dec-1)"]


def test_no_alarm_no_line() -> None:
    assert broker_alarms([{"worker": "w", "state": "running", "broker_alarm": None}]) == []


def test_the_feed_rows_carry_the_newest_messages_alarm() -> None:
    base = {"worker": "enc-0", "cluster": "cluster-a", "state": "running", "values": {}}
    msgs = [{**base, "sent": 1.0}, {**base, "sent": 2.0, "broker_alarm": "cluster-a", "broker_alarm_reason": "low on disk"}]
    rows = with_alarms(msgs, now=3.0, lost_after=60.0)
    assert broker_alarms(rows) == ["ALARM cluster-a: low on disk (publishing blocked: enc-0)"]
    cleared = with_alarms([*msgs, {**base, "sent": 2.5}], now=3.0, lost_after=60.0)
    assert broker_alarms(cleared) == []


def test_the_feed_rows_carry_the_newest_messages_certificate_warning() -> None:
    base = {"cluster": "cluster-b", "state": "running", "values": {}, "sent": 1.0}
    warning = "client certificate /c/cert.pem expires in 3.0 days (2026-12-01 10:00 UTC): run `nebula-mq certs rotate`"
    msgs = [{**base, "worker": "dec-0", "cert_expires_in_days": 3.0, "cert_warning": warning},
            {**base, "worker": "dec-1", "cert_expires_in_days": 200.0}]
    rows = with_alarms(msgs, now=2.0, lost_after=60.0)
    assert {r["worker"]: r["cert_expires_in_days"] for r in rows} == {"dec-0": 3.0, "dec-1": 200.0}
    assert certificate_warnings(rows) == [f"CERTIFICATE dec-0: {warning}"]
