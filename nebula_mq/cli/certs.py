"""``nebula-mq certs init DIR``: per-cluster CAs, trust bundles, broker and client certificates."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("certs", help="manage TLS certificates")
    sub = parser.add_subparsers(dest="certs_cmd", metavar="CMD", required=True)
    init = sub.add_parser("init", help="create (or keep valid) CAs and certificates under DIR")
    init.add_argument("dir", metavar="DIR")
    init.add_argument("--clusters", default="cluster-a,cluster-b", help="comma-separated cluster names")
    init.add_argument("--identity", action="append", default=[], metavar="CLUSTER:CN",
                      help="also issue a client certificate CN on CLUSTER (repeatable)")
    init.set_defaults(func=_init)


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
