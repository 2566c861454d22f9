"""``nebula-mq certs init|issue|rotate|revoke|list|export-ca|import-ca|request|sign|install``: TLS
certificate lifecycle. ``request``/``sign``/``install`` issue a certificate whose private key never
leaves the host that uses it (``nebula_mq.security.csr``).

Every change is recorded in the audit log (``--audit``, default ``$NEBULA_AUDIT_LOG``
or ``run/audit/audit.jsonl``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
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
        if name != "revoke":
            p.add_argument("--hostname", action="append", default=[], metavar="H",
                           help="with CN server: also put H in the broker's certificate (the name peers and "
                                "workers reach it by; repeatable; names it already has are kept)")
        p.set_defaults(func=func)
    req = sub.add_parser("request", help="make a key and a certificate signing request for CN on this host "
                                         "(the key stays here; send the CSR to the CA's host)")
    req.add_argument("dir", metavar="DIR", help="certificate directory on this host")
    req.add_argument("cluster", metavar="CLUSTER", help="the cluster the identity belongs to")
    req.add_argument("cn", metavar="CN", help="the identity ('server' = this cluster's broker)")
    req.add_argument("--hostname", action="append", default=[], metavar="H",
                     help="with CN server: a name the broker is reached by (repeatable)")
    req.set_defaults(func=_request)
    sig = sub.add_parser("sign", help="sign a CSR with CLUSTER's CA (on the host that holds it); "
                                      "print or write the certificate")
    sig.add_argument("dir", metavar="DIR", help="certificate directory holding CLUSTER's CA")
    sig.add_argument("cluster", metavar="CLUSTER", help="the cluster whose CA signs")
    sig.add_argument("csr", metavar="CSR", help="the request (PEM, from `certs request`)")
    sig.add_argument("--server", action="store_true", help="a broker's certificate: keep the request's host names")
    sig.add_argument("--out", metavar="FILE", help="write the certificate here (default: standard output)")
    sig.add_argument("--audit", help="audit log (default $NEBULA_AUDIT_LOG or run/audit/audit.jsonl)")
    sig.set_defaults(func=_sign)
    ins = sub.add_parser("install", help="put a signed certificate in place with the key its request made")
    ins.add_argument("dir", metavar="DIR", help="certificate directory on this host (where `certs request` ran)")
    ins.add_argument("cluster", metavar="CLUSTER", help="the cluster the identity belongs to")
    ins.add_argument("cn", metavar="CN", help="the identity ('server' = this cluster's broker)")
    ins.add_argument("cert", metavar="CERT", help="the signed certificate (PEM, from `certs sign`)")
    ins.set_defaults(func=_install)
    ls = sub.add_parser("list", help="every certificate with its expiry; warns about expiring ones")
    ls.add_argument("dir", metavar="DIR", help="certificate directory (what `certs init` made; the stack's is <stack>/certs)")
    ls.set_defaults(func=_list)
    exp = sub.add_parser("export-ca", help="print CLUSTER's CA certificate (to send to the peer cluster)")
    exp.add_argument("dir", metavar="DIR", help="certificate directory (what `certs init` made; the stack's is <stack>/certs)")
    exp.add_argument("cluster", metavar="CLUSTER", help="the cluster whose CA certificate to print")
    exp.set_defaults(func=_export)
    xcrl = sub.add_parser("export-crl", help="print CLUSTER's current CRL (peers need it: their brokers check "
                                             "this cluster's certificates against it)")
    xcrl.add_argument("dir", metavar="DIR", help="certificate directory holding CLUSTER's CA")
    xcrl.add_argument("cluster", metavar="CLUSTER", help="the cluster whose CRL to print")
    xcrl.set_defaults(func=_export_crl)
    icrl = sub.add_parser("import-crl", help="publish PEER's CRL (PEM FILE) for CLUSTER's broker; refresh it "
                                             "before it expires (30 days)")
    icrl.add_argument("dir", metavar="DIR", help="certificate directory on this host")
    icrl.add_argument("cluster", metavar="CLUSTER", help="the cluster whose broker checks the peer's certificates")
    icrl.add_argument("peer", metavar="PEER", help="the peer cluster's name (its CA imported with import-ca)")
    icrl.add_argument("file", metavar="FILE", help="the peer's CRL (PEM, from its `certs export-crl`)")
    icrl.set_defaults(func=_import_crl)
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

    ident = issue(args.dir, args.cluster, args.cn, _audit(args), hostnames=args.hostname)
    print(f"{args.cluster}/{args.cn}: {ident.cert_file}")
    return 0


def _rotate(args: argparse.Namespace) -> int:
    from nebula_mq.security.lifecycle import rotate

    ident = rotate(args.dir, args.cluster, args.cn, _audit(args), hostnames=args.hostname)
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


def _read(path: str) -> bytes:
    from nebula_mq.errors import CertificateError

    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CertificateError(f"{path}: {exc}") from None


def _request(args: argparse.Namespace) -> int:
    from nebula_mq.security.csr import request

    csr = request(args.dir, args.cluster, args.cn, args.hostname)
    print(f"{args.cluster}/{args.cn}: request {csr} (the key stays beside it); send the request to the host "
          f"holding {args.cluster}'s CA: `nebula-mq certs sign DIR {args.cluster} {csr.name}"
          f"{' --server' if args.cn == 'server' else ''} --out cert.pem`")
    return 0


def _sign(args: argparse.Namespace) -> int:
    from nebula_mq.security.csr import sign

    pem = sign(args.dir, args.cluster, _read(args.csr), _audit(args), server=args.server)
    if args.out:
        from nebula_mq.security.pem import write_public

        write_public(Path(args.out), pem)
        print(f"{args.cluster}: signed {args.csr} -> {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(pem.decode())
    return 0


def _install(args: argparse.Namespace) -> int:
    from nebula_mq.security.csr import install

    ident = install(args.dir, args.cluster, args.cn, _read(args.cert))
    print(f"{args.cluster}/{args.cn}: installed {ident.cert_file} with its key {ident.key_file}")
    return 0


def _export_crl(args: argparse.Namespace) -> int:
    from nebula_mq.security.lifecycle import _ca
    from nebula_mq.security.revocation import crl_dir, write_crl

    ca = _ca(args.dir, args.cluster)
    crl_dir(args.dir).mkdir(parents=True, exist_ok=True)
    sys.stdout.write(write_crl(ca, crl_dir(args.dir)).read_text())  # freshly signed: valid 30 days
    return 0


def _import_crl(args: argparse.Namespace) -> int:
    from nebula_mq.security.lifecycle import _ca
    from nebula_mq.security.revocation import import_peer_crl

    kept = import_peer_crl(args.dir, _ca(args.dir, args.cluster), args.peer, _read(args.file))
    print(f"{args.cluster}: {args.peer}'s CRL published for the broker ({kept})")
    return 0
