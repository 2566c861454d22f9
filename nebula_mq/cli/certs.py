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

from nebula_mq.cli.options import AUDIT_HELP, audit_log

DIR_HELP = "certificate directory (what `certs init` made; the stack's is <stack>/certs)"
HOSTNAME_HELP = ("with CN server: a name the broker is reached by, put in its certificate (repeatable; "
                 "names it already has are kept)")

# verb -> (help, function, positionals as (name, help), options: audit, hostname)
VERBS: dict[str, tuple[str, str, tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "issue": ("issue (or keep while valid) a certificate CN from CLUSTER's CA ('server' = the broker)", "_issue",
              (("dir", DIR_HELP), ("cluster", "the cluster whose CA signs the certificate"),
               ("cn", "the certificate's common name (a worker identity; 'server' = the broker)")),
              ("audit", "hostname")),
    "rotate": ("new key and certificate for CN ('server' = the broker); revokes the old one", "_rotate",
               (("dir", DIR_HELP), ("cluster", "the cluster whose CA signed the certificate"),
                ("cn", "the certificate's common name (a worker identity; 'server' = the broker)")),
               ("audit", "hostname")),
    "revoke": ("revoke CN's certificate: refused at its next connection", "_revoke",
               (("dir", DIR_HELP), ("cluster", "the cluster whose CA signed the certificate"),
                ("cn", "the certificate's common name (a worker identity)")), ("audit",)),
    "request": ("make a key and a certificate signing request for CN on this host (the key stays here; "
                "send the CSR to the CA's host)", "_request",
                (("dir", "certificate directory on this host"), ("cluster", "the cluster the identity belongs to"),
                 ("cn", "the identity ('server' = this cluster's broker)")), ("hostname",)),
    "sign": ("sign a CSR with CLUSTER's CA (on the host that holds it); print or write the certificate", "_sign",
             (("dir", "certificate directory holding CLUSTER's CA"), ("cluster", "the cluster whose CA signs"),
              ("csr", "the request (PEM, from `certs request`)")), ("audit",)),
    "install": ("put a signed certificate in place with the key its request made", "_install",
                (("dir", "certificate directory on this host (where `certs request` ran)"),
                 ("cluster", "the cluster the identity belongs to"),
                 ("cn", "the identity ('server' = this cluster's broker)"),
                 ("cert", "the signed certificate (PEM, from `certs sign`)")), ()),
    "list": ("every certificate with its expiry; warns about expiring ones", "_list", (("dir", DIR_HELP),), ()),
    "export-ca": ("print CLUSTER's CA certificate (to send to the peer cluster)", "_export",
                  (("dir", DIR_HELP), ("cluster", "the cluster whose CA certificate to print")), ()),
    "export-crl": ("print CLUSTER's current CRL (peers need it: their brokers check this cluster's certificates "
                   "against it)", "_export_crl",
                   (("dir", "certificate directory holding CLUSTER's CA"),
                    ("cluster", "the cluster whose CRL to print")), ()),
    "import-crl": ("publish PEER's CRL (PEM FILE) for CLUSTER's broker; refresh it before it expires (30 days)",
                   "_import_crl",
                   (("dir", "certificate directory on this host"),
                    ("cluster", "the cluster whose broker checks the peer's certificates"),
                    ("peer", "the peer cluster's name (its CA imported with import-ca)"),
                    ("file", "the peer's CRL (PEM, from its `certs export-crl`)")), ()),
    "import-ca": ("trust PEER's CA certificate (PEM FILE) on CLUSTER", "_import",
                  (("dir", DIR_HELP), ("cluster", "the cluster that will trust the peer's CA"),
                   ("peer", "the peer cluster's name"),
                   ("file", "the peer's CA certificate (PEM, from its `certs export-ca`)")), ("audit",)),
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("certs", help="manage TLS certificates")
    sub = parser.add_subparsers(dest="certs_cmd", metavar="CMD", required=True)
    init = sub.add_parser("init", help="create (or keep valid) CAs and certificates under DIR")
    init.add_argument("dir", metavar="DIR", help=DIR_HELP)
    init.add_argument("--clusters", default="cluster-a,cluster-b", help="comma-separated cluster names")
    init.add_argument("--identity", action="append", default=[], metavar="CLUSTER:CN",
                      help="also issue a client certificate CN on CLUSTER (repeatable)")
    init.set_defaults(func=_init)
    for verb, (text, func, positionals, options) in VERBS.items():
        p = sub.add_parser(verb, help=text)
        for name, help_text in positionals:
            p.add_argument(name, metavar=name.upper(), help=help_text)
        if "audit" in options:
            p.add_argument("--audit", help=AUDIT_HELP)
        if "hostname" in options:
            p.add_argument("--hostname", action="append", default=[], metavar="H", help=HOSTNAME_HELP)
        if verb == "sign":
            p.add_argument("--server", action="store_true", help="a broker's certificate: keep the request's host names")
            p.add_argument("--out", metavar="FILE", help="write the certificate here (default: standard output)")
        p.set_defaults(func=globals()[func])


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

    ident = issue(args.dir, args.cluster, args.cn, audit_log(args.audit), hostnames=args.hostname)
    print(f"{args.cluster}/{args.cn}: {ident.cert_file}")
    return 0


def _rotate(args: argparse.Namespace) -> int:
    from nebula_mq.security.lifecycle import rotate

    ident = rotate(args.dir, args.cluster, args.cn, audit_log(args.audit), hostnames=args.hostname)
    print(f"{args.cluster}/{args.cn}: rotated, new certificate {ident.cert_file}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from nebula_mq.security.lifecycle import revoke_cert

    serial = revoke_cert(args.dir, args.cluster, args.cn, audit_log(args.audit))
    print(f"{args.cluster}/{args.cn}: serial {serial:x} revoked (CRL published; refused at next connection)")
    return 0


def _list(args: argparse.Namespace) -> int:
    from nebula_mq.errors import CertificateError
    from nebula_mq.security.lifecycle import list_certs

    if not Path(args.dir).is_dir():
        raise CertificateError(f"no certificates directory {args.dir!r} (run `nebula-mq certs init DIR` first)")

    for r in list_certs(args.dir):
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
    from nebula_mq.security.certs import import_peer_ca
    from nebula_mq.security.lifecycle import _ca

    trust = import_peer_ca(_ca(args.dir, args.cluster), args.peer, _read(args.file))
    audit_log(args.audit).record("ca_imported", cluster=args.cluster, peer=args.peer)
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

    pem = sign(args.dir, args.cluster, _read(args.csr), audit_log(args.audit), server=args.server)
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
