"""``nebula-mq data-access grant|revoke|list``: a data owner lets a job read a named dataset."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("data-access", help="grant jobs access to datasets (data owners)")
    sub = parser.add_subparsers(dest="data_access_cmd", metavar="CMD", required=True)
    for name, func, text in (("grant", _grant, "let JOB read OWNER's DATASET (signed by OWNER's key)"),
                             ("revoke", _revoke, "withdraw the grant")):
        p = sub.add_parser(name, help=text)
        p.add_argument("root", metavar="ROOT", help="data root (datasets/, owners/, grants/)")
        p.add_argument("owner", metavar="OWNER", help="the data owner who signs the grant")
        p.add_argument("job", metavar="JOB", help="the job id the grant is for")
        p.add_argument("dataset", metavar="DATASET", help="one of OWNER's datasets under ROOT/datasets")
        p.add_argument("--audit", help="audit log (default $NEBULA_AUDIT_LOG or run/audit/audit.jsonl)")
        p.set_defaults(func=func)
    ls = sub.add_parser("list", help="OWNER's grants (after checking their signature)")
    ls.add_argument("root", metavar="ROOT", help="data root (datasets/, owners/, grants/)")
    ls.add_argument("owner", metavar="OWNER", help="whose grants to list")
    ls.set_defaults(func=_list)


def _owner(args: argparse.Namespace) -> Any:
    from nebula_mq.security.audit import AuditLog, default_audit_path
    from nebula_mq.security.data_access import DataOwner

    return DataOwner(args.root, args.owner, AuditLog(args.audit or default_audit_path()))


def _grant(args: argparse.Namespace) -> int:
    _owner(args).grant(args.job, args.dataset)
    print(f"{args.owner}/{args.dataset}: granted to job {args.job}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    _owner(args).revoke(args.job, args.dataset)
    print(f"{args.owner}/{args.dataset}: grant to job {args.job} withdrawn")
    return 0


def _list(args: argparse.Namespace) -> int:
    from nebula_mq.security.data_access import load_grants

    for g in load_grants(args.root, args.owner):
        print(f"{args.owner}/{g.dataset} -> job {g.job}")
    return 0
