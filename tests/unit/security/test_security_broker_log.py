"""Connection events from RabbitMQ 3.10.8 log lines (copied from real refusals on this stack)."""

from __future__ import annotations

from pathlib import Path

from nebula_mq.security.audit import AuditLog, verify_chain
from nebula_mq.security.broker_log import BrokerLogAuditor, parse_lines

LINES = """\
2026-11-22 04:44:01.569800+00:00 [notice] <0.862.0> TLS server: In state hello at tls_record.erl:564 generated SERVER ALERT: Fatal - Unexpected Message
2026-11-22 04:44:01.569800+00:00 [notice] <0.862.0>  - {unsupported_record_type,65}
2026-11-22 04:44:01.574912+00:00 [notice] <0.868.0> TLS server: In state hello at tls_handshake.erl:366 generated SERVER ALERT: Fatal - Protocol Version
2026-11-22 04:44:01.588658+00:00 [notice] <0.880.0> TLS server: In state wait_cert at tls_handshake_1_3.erl:1484 generated SERVER ALERT: Fatal - Certificate required
2026-11-22 04:44:01.622702+00:00 [notice] <0.886.0> TLS server: In state wait_cert at ssl_handshake.erl:2098 generated SERVER ALERT: Fatal - Bad Certificate
2026-11-22 04:40:56.427457+00:00 [notice] <0.837.0> TLS server: In state wait_cert at ssl_handshake.erl:2104 generated SERVER ALERT: Fatal - Certificate Revoked
2026-11-22 04:44:01.645452+00:00 [error] <0.895.0> EXTERNAL login refused: user 'w2x' - invalid credentials
2026-11-22 04:44:03.195098+00:00 [info] <0.924.0> connection <0.924.0> (127.0.0.1:48926 -> 127.0.0.1:24339): user 'w2x' authenticated and granted access to vhost 'nebula-crl1'
2026-11-22 04:44:03.196259+00:00 [error] <0.933.0> Channel error on connection <0.924.0> (127.0.0.1:48926 -> 127.0.0.1:24339, vhost: 'nebula-crl1', user: 'w2x'), channel 1:
2026-11-22 04:44:03.196259+00:00 [error] <0.933.0> operation queue.declare caused a channel exception access_refused: access to queue 'nope' in vhost 'nebula-crl1' refused for user 'w2x'
""".splitlines()


def test_each_refusal_kind_is_recognised() -> None:
    events = parse_lines(LINES)
    assert [(e["event"], e.get("reason")) for e in events] == [
        ("connection_refused", "not_tls"),
        ("connection_refused", "tls_version_too_old"),
        ("connection_refused", "no_client_certificate"),
        ("connection_refused", "untrusted_certificate"),
        ("connection_refused", "certificate_revoked"),
        ("connection_refused", "login_refused"),
        ("connection_accepted", None),
        ("permission_denied", None),
    ]
    assert events[-1]["user"] == "w2x" and events[-1]["operation"] == "queue.declare"
    assert "access to queue 'nope'" in events[-1]["detail"]


def test_auditor_reads_only_new_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    log.write_text("\n".join(LINES[:3]) + "\n" + LINES[3][:40])  # last line still being written
    audit = AuditLog(tmp_path / "audit.jsonl")
    auditor = BrokerLogAuditor(log, audit, "cluster-a", tmp_path / "cursor")
    assert [e["reason"] for e in auditor.scan()] == ["not_tls", "tls_version_too_old"]
    with open(log, "a") as fh:
        fh.write(LINES[3][40:] + "\n")
    assert [e["reason"] for e in auditor.scan()] == ["no_client_certificate"]
    assert auditor.scan() == []
    recs = list(audit.records())
    assert [r["cluster"] for r in recs] == ["cluster-a"] * 3 and verify_chain(audit.path).records == 3
