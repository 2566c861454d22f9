"""``nebula-mq certs init|issue|rotate|revoke|list|export-ca|import-ca``: TLS certificate lifecycle.

Every change is recorded in the audit log (``--audit``, default ``$NEBULA_AUDIT_LOG``
or ``run/audit/audit.jsonl``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("certs", help="manage TLS certificates")
    sub = parser.add_subparsers(dest="certs_cmd", metavar="CMD", required=True)
    init = sub.add_parser("init", help="create (or keep valid) CAs and certificates under DIR")
    init.add_argument("dir", metavar="DIR", help="certificate directory (what `certs init` made; the stack's is <stack>/certs)")
    init.add_argument("--clusters", default="cluster-a,cluster-b", help="comma-separated cluster names")
    init.add_argument("--identity", action="append", default=[], metavar="CLUSTER:CN",
                      help="also issue a client certificate CN on CLUSTER (repeatable)")
    init.set_defaults(func=_init)
    for name, func, text in (
        ("issue", _issue, "issue (or keep while valid) a client certificate CN from CLUSTER's CA"),
        ("rotate", _rotate, "new key and certificate for CN ('server' = the broker); revokes the old one"),
        ("revoke", _revoke, "revoke CN's certificate: refused at its next connection"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("dir", metavar="DIR", help="certificate directory (what `certs init` made; the stack's is <stack>/certs)")
        p.add_argument("cluster", metavar="CLUSTER", help="the cluster whose CA signs (or signed) the certificate")
        p.add_argument("cn", metavar="CN", help="the certificate's common name (a worker identity; 'server' = the broker)")
        p.add_argument("--audit", help="audit log (default $NEBULA_AUDIT_LOG or run/audit/audit.jsonl)")
        p.set_defaults(func=func)
    ls = sub.add_parser("list", help="every certificate with its expiry; warns about expiring ones")
    ls.add_argument("dir", metavar="DIR", help="certificate directory (what `certs init` made; the stack's is <stack>/certs)")
    ls.set_defaults(func=_list)
    exp = sub.add_parser("export-ca", help="print CLUSTER's CA certificate (to send to the peer cluster)")
    exp.add_argument("dir", metavar="DIR", help="certificate directory (what `certs init` made; the stack's is <stack>/certs)")
    exp.add_argument("cluster", metavar="CLUSTER", help="the cluster whose CA certificate to print")
    exp.set_defaults(func=_export)
    imp = sub.add_parser("import-ca", help="trust PEER's CA certificate (PEM FILE) on CLUSTER")
    imp.add_argument("dir", metavar="DIR", help="certificate directory (what `certs init` made; the stack's is <stack>/certs)")
    imp.add_argument("cluster", metavar="CLUSTER", help="the cluster that will trust the peer's CA")
    imp.add_argument("peer", metavar="PEER", help="the peer cluster's name")
    imp.add_argument("file", metavar="FILE", help="the peer's CA certificate (PEM, from its `certs export-ca`)")
    imp.add_argument("--audit", help="audit log (default $NEBULA_AUDIT_LOG or run/audit/audit.jsonl)")
    imp.set_defaults(func=_import)


def _audit(args: argparse.Namespace) -> Any:
    from nebula_mq.security.audit import AuditLog, default_audit_path

    return AuditLog(args.audit or default_audit_path())


def _init(args: argparse.Namespace) -> int:
    from nebula_mq.errors import CertificateError
    from nebula_mq.security.certs import init_certs

    clusters = [c.strip() for c in args.clusters.split(",") if c.strip()]
    identities = []
    for item in args.identity:
        cluster, sep, cn = item.partition(":")
        if not sep or not cn:
            raise CertificateError(f"--identity expects CLUSTER:CN, got {item!r}")
        identities.append((cluster, cn))
    cas = init_certs(args.dir, clusters, identities)
    for ca in cas.values():
        clients = sorted(p.name for p in (ca.dir / "clients").iterdir())
        print(f"{ca.cluster}: CA {ca.ca_cert_file}, trust {ca.trust_file}, server {ca.server().cert_file}, "
              f"clients {', '.join(clients)}")
    return 0


def _issue(args: argparse.Namespace) -> int:
    from nebula_mq.security.lifecycle import issue

    ident = issue(args.dir, args.cluster, args.cn, _audit(args))
    print(f"{args.cluster}/{args.cn}: {ident.cert_file}")
    return 0


def _rotate(args: argparse.Namespace) -> int:
    from nebula_mq.security.lifecycle import rotate

    ident = rotate(args.dir, args.cluster, args.cn, _audit(args))
    print(f"{args.cluster}/{args.cn}: rotated, new certificate {ident.cert_file}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from nebula_mq.security.lifecycle import revoke_cert

    serial = revoke_cert(args.dir, args.cluster, args.cn, _audit(args))
    print(f"{args.cluster}/{args.cn}: serial {serial:x} revoked (CRL published; refused at next connection)")
    return 0


def _list(args: argparse.Namespace) -> int:
    from pathlib import Path

    from nebula_mq.errors import CertificateError
    from nebula_mq.security.lifecycle import list_certs

    if not Path(args.dir).is_dir():
        raise CertificateError(f"no certificates directory {args.dir!r} (run `nebula-mq certs init DIR` first)")

    rows = list_certs(args.dir)
    for r in rows:
        print(f"{r.cluster:12} {r.name:28} {r.status:9} {r.not_after:%Y-%m-%d} ({r.days_left:7.1f} days) "
              f"serial {r.serial:x}")
        if r.status in ("expiring", "expired"):
            print(f"warning: {r.cluster}/{r.name} {r.status} on {r.not_after:%Y-%m-%d}: "
                  f"run `nebula-mq certs rotate {args.dir} {r.cluster} {r.name}`", file=sys.stderr)
    return 0


def _export(args: argparse.Namespace) -> int:
    from nebula_mq.security.lifecycle import _ca

    sys.stdout.write(_ca(args.dir, args.cluster).ca_cert_file.read_text())
    return 0


def _import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from nebula_mq.errors import CertificateError
    from nebula_mq.security.certs import import_peer_ca
    from nebula_mq.security.lifecycle import _ca

    try:
        pem = Path(args.file).read_bytes()
    except OSError as exc:
        raise CertificateError(f"{args.file}: {exc}") from None
    trust = import_peer_ca(_ca(args.dir, args.cluster), args.peer, pem)
    _audit(args).record("ca_imported", cluster=args.cluster, peer=args.peer)
    print(f"{args.cluster}: now trusts {args.peer}'s CA ({trust})")
    return 0
