"""``nebula-mq audit verify|show|scan-broker``: the hash-chained audit log."""

from __future__ import annotations

import argparse
from typing import Any

from nebula_mq.cli.options import add_stack_option


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("audit", help="verify or read the audit log")
    sub = parser.add_subparsers(dest="audit_cmd", metavar="CMD", required=True)
    v = sub.add_parser("verify", help="check the hash chain; exit 1 naming the first edited line")
    v.add_argument("--log", help="audit log (default $NEBULA_AUDIT_LOG or run/audit/audit.jsonl)")
    v.add_argument("--expect-head", help="hash the last record must have (detects a truncated tail)")
    v.set_defaults(func=_verify)
    s = sub.add_parser("show", help="print records, optionally of one event type")
    s.add_argument("--log", help="audit log (default $NEBULA_AUDIT_LOG or run/audit/audit.jsonl)")
    s.add_argument("--event", help="only this event (e.g. message_rejected)")
    s.set_defaults(func=_show)
    b = sub.add_parser("scan-broker", help="record the connections (accepted/refused) the stack's brokers logged")
    b.add_argument("--log", help="audit log to append to (default $NEBULA_AUDIT_LOG or run/audit/audit.jsonl)")
    add_stack_option(b)
    b.set_defaults(func=_scan)


def _path(args: argparse.Namespace) -> Any:
    from nebula_mq.security.audit import default_audit_path

    return args.log or default_audit_path()


def _existing_log(args: argparse.Namespace) -> Any:
    """The audit log to read; a mistyped path must not read as an empty, valid log."""
    from pathlib import Path

    from nebula_mq.errors import AuditError

    path = _path(args)
    if not Path(path).is_file():
        raise AuditError(f"no audit log at {str(path)!r} (check --log or $NEBULA_AUDIT_LOG)")
    return path


def _verify(args: argparse.Namespace) -> int:
    from nebula_mq.security.audit import verify_chain

    path = _existing_log(args)
    report = verify_chain(path, args.expect_head)
    print(f"audit log OK: {report.records} records, head {report.head}")
    return 0


def _show(args: argparse.Namespace) -> int:
    import json

    from nebula_mq.security.audit import AuditLog

    for rec in AuditLog(_existing_log(args)).records():
        if args.event is None or rec.get("event") == args.event:
            print(json.dumps(rec, sort_keys=True))
    return 0


def _scan(args: argparse.Namespace) -> int:
    from nebula_mq.security.audit import AuditLog
    from nebula_mq.security.broker_log import BrokerLogAuditor
    from nebula_mq.stack import Stack
    from nebula_mq.stack.node import log_file

    stack = Stack.open(args.stack)
    audit = AuditLog(_path(args))
    for n in stack.layout.nodes:
        events = BrokerLogAuditor(log_file(n), audit, n.cluster, n.path / "audit.cursor").scan()
        refused = sum(e["event"] != "connection_accepted" for e in events)
        print(f"{n.cluster}: {len(events)} connection events recorded ({refused} refusals)")
    return 0
