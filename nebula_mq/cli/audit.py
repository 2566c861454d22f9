"""``nebula-mq audit verify|show|scan-broker|dead-letters``: the hash-chained audit log, and the
checks that feed it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from nebula_mq.cli.options import AUDIT_HELP, add_stack_option, audit_log


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("audit", help="verify or read the audit log")
    sub = parser.add_subparsers(dest="audit_cmd", metavar="CMD", required=True)
    v = sub.add_parser("verify", help="check the hash chain; exit 1 naming the first edited line")
    v.add_argument("--log", help=AUDIT_HELP)
    v.add_argument("--expect-head", help="hash the last record must have (detects a truncated tail)")
    v.set_defaults(func=_verify)
    s = sub.add_parser("show", help="print records, optionally of one event type")
    s.add_argument("--log", help=AUDIT_HELP)
    s.add_argument("--event", help="only this event (e.g. message_rejected)")
    s.set_defaults(func=_show)
    b = sub.add_parser("scan-broker", help="record the connections (accepted/refused) the stack's brokers logged")
    b.add_argument("--log", help="audit log to append to (default $NEBULA_AUDIT_LOG or run/audit/audit.jsonl)")
    add_stack_option(b)
    b.set_defaults(func=_scan)
    d = sub.add_parser("dead-letters", help="check every message in the job's dead-letter queues was condemned "
                                            "by one of its consuming roles; exit 1 naming each that was not")
    d.add_argument("config", metavar="JOB.toml", help="the job file")
    d.add_argument("--cluster", metavar="NAME", help="only this cluster's queue (default: every cluster of the stack)")
    d.add_argument("--log", help="also require a message_dead_lettered record in this audit log (e.g. "
                                 "<run_dir>/audit/audit.jsonl), and append each finding to it")
    d.add_argument("--limit", type=int, default=10_000, help="read at most this many messages per queue")
    add_stack_option(d)
    d.set_defaults(func=_dead_letters)


def _existing_log(log: str | None, check: str = "--log or $NEBULA_AUDIT_LOG") -> Any:
    """The audit log to read (``log``, else the default); a mistyped path must not read as an
    empty, valid log."""
    from nebula_mq.errors import AuditError
    from nebula_mq.security.audit import default_audit_path

    path = log or default_audit_path()
    if not Path(path).is_file():
        raise AuditError(f"no audit log at {str(path)!r} (check {check})")
    return path


def _verify(args: argparse.Namespace) -> int:
    from nebula_mq.security.audit import verify_chain

    report = verify_chain(_existing_log(args.log), args.expect_head)
    print(f"audit log OK: {report.records} records, head {report.head}")
    return 0


def _show(args: argparse.Namespace) -> int:
    for rec in audit_log(_existing_log(args.log)).records():
        if args.event is None or rec.get("event") == args.event:
            print(json.dumps(rec, sort_keys=True))
    return 0


def _scan(args: argparse.Namespace) -> int:
    from nebula_mq.security.broker_log import BrokerLogAuditor
    from nebula_mq.stack import Stack
    from nebula_mq.stack.node import log_file

    stack = Stack.open(args.stack)
    audit = audit_log(args.log)
    for n in stack.layout.nodes:
        events = BrokerLogAuditor(log_file(n), audit, n.cluster, n.path / "audit.cursor").scan()
        refused = sum(e["event"] != "connection_accepted" for e in events)
        print(f"{n.cluster}: {len(events)} connection events recorded ({refused} refusals)")
    return 0


def ensure_dead_letter_auditor(stack: Any, cluster: str, job_id: str) -> Any:
    """``cluster``'s broker settings as the job's dead-letter auditor (read on the dead-letter
    queue only), whose user and permission this adds to the job's vhost (idempotent)."""
    from nebula_mq import topology
    from nebula_mq.security.roles import dead_letter_auditor, dead_letter_auditor_permissions

    user, vhost, perms = dead_letter_auditor(job_id), topology.vhost(job_id), dead_letter_auditor_permissions(job_id)
    stack.admin(cluster).import_definitions({
        # Empty hash: no password, certificate login only (as stack.provision makes worker users).
        "users": [{"name": user, "password_hash": "", "hashing_algorithm": "rabbit_password_hashing_sha256",
                   "tags": []}],
        "permissions": [{"user": user, "vhost": vhost, "configure": perms.configure, "write": perms.write,
                         "read": perms.read}]})
    return stack.broker_settings(cluster, user, vhost=vhost)


def consuming_identities(job_id: str, plan: Any, cluster: str) -> frozenset[str]:
    """The identities that may condemn messages on ``cluster``: its roles that consume, and the
    job's key courier where it receives the key (as ``stack.provision`` grants them)."""
    from nebula_mq import topology
    from nebula_mq.security.roles import WorkerIdentity, dead_letter_writers

    keys = topology.key_flows(plan.flows)
    flows = (*plan.flows, *keys)
    courier = WorkerIdentity(topology.key_courier(job_id), [f.name for f in keys if f.src_cluster == cluster],
                             [f.name for f in keys if f.dst_cluster == cluster])
    return dead_letter_writers(job_id, (*plan.identities(job_id).get(cluster, ()), courier), flows)


def dead_letter_findings(broker: Any, job_id: str, cluster: str, consumers: frozenset[str],
                         audited: frozenset[str] | None, limit: int = 10_000) -> tuple[list[Any], int, int]:
    """(findings, messages read, messages left unread) for ``cluster``'s dead-letter queue."""
    from nebula_mq import topology
    from nebula_mq.security.dead_letters import check
    from nebula_mq.transport.dead_letters import peek_dead_letters

    peek = peek_dead_letters(broker, topology.dead_letter_queue(job_id), limit)
    return check(cluster, peek.letters, consumers, audited), len(peek.letters), peek.unread


def _dead_letters(args: argparse.Namespace) -> int:
    from nebula_mq.stack import Stack
    from workers.plans import plan_for
    from workers.registry import load_job_settings

    settings = load_job_settings(args.config)
    job_id, plan, stack = settings.job.id, plan_for(settings), Stack.open(args.stack)
    audit = audit_log(_existing_log(args.log, "--log")) if args.log else None
    audited = None if audit is None else frozenset(
        str(r.get("message_id")) for r in audit.records() if r.get("event") == "message_dead_lettered")
    failed = False
    for cluster in [args.cluster] if args.cluster else stack.clusters:
        broker = ensure_dead_letter_auditor(stack, cluster, job_id)
        findings, read, unread = dead_letter_findings(broker, job_id, cluster, consuming_identities(job_id, plan, cluster),
                                                      audited, args.limit)
        for f in findings:
            print(f.line())
            if audit is not None:
                audit.record("dead_letter_unvouched", cluster=cluster, message_id=f.message_id, user_id=f.user_id,
                             reason=f.reason, problem=f.problem)
        print(f"{cluster}: {read} dead letters read, {len(findings)} unvouched")
        if unread:
            print(f"INCOMPLETE {cluster}: {unread} more dead letters not read (raise --limit)", file=sys.stderr)
        failed = failed or bool(findings) or bool(unread)
    return 1 if failed else 0
