"""A job's broker objects on every cluster: vhost, certificate users, federation upstreams, policy.

Everything for one cluster goes into one definitions document imported with
``rabbitmqctl import_definitions`` (one CLI call per cluster instead of a dozen;
import is additive and overwrites same-named objects, so provisioning is idempotent).

Per cluster ``C`` (see the layout in ``nebula_mq.topology``):

* vhost ``topology.vhost(job)``;
* worker users (certificate login, no password): a
  :class:`~nebula_mq.security.roles.WorkerIdentity` gets exactly its role's
  permissions (``nebula_mq.security.roles.permissions``); a plain CN gets every
  queue of the job;
* for each peer ``P``: user ``federation-P`` (the CN of P's federation client
  certificate), allowed only to pull the flows that go from here to P;
* for each cluster ``S`` that has flows *into* C: upstream ``nebula-upstream-S``
  pointing at S through the emulated WAN relay, and a policy making exactly those
  flows' queues federated queues here. Flows whose destination is not C never
  match C's policy: their copy on C is the upstream one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from nebula_mq import topology
from nebula_mq.errors import StackError
from nebula_mq.security.certs import Identity, federation_identity
from nebula_mq.security.roles import Permissions, federation_permissions, permissions
from nebula_mq.topology import Flow

# Federation link tuning (RABBITMQ.md): on-confirm loses nothing; never clean up the
# upstream buffer on a downstream stop; small prefetch for MB-sized tensors.
ACK_MODE = "on-confirm"
PREFETCH = 16
EXPIRES_MS = 7 * 24 * 3600 * 1000
RECONNECT_DELAY_S = 1  # a healed WAN carries traffic again within ~1 s (issue: resume < 2 s)


@dataclass(frozen=True)
class Upstream:
    """How cluster ``dst`` reaches the broker of cluster ``src``."""

    src: str
    host: str
    # The relay port forwarding to src's TLS listener (the emulated WAN).
    port: int
    # dst's federation client identity, trusted by src.
    client: Identity


def _alternation(names: Iterable[str]) -> str:
    return "^(" + "|".join(re.escape(n) for n in sorted(names)) + ")$"


def job_queue_pattern(job_id: str, flows: Sequence[Flow]) -> str:
    """Regex matching exactly the job's queues (flows and dead-letter queue)."""
    names = [topology.queue_name(job_id, f.name) for f in flows]
    return _alternation([*names, topology.dead_letter_queue(job_id)])


def upstream_uri(job_id: str, up: Upstream) -> str:
    c = up.client
    query = (
        f"cacertfile={c.ca_file}&certfile={c.cert_file}&keyfile={c.key_file}"
        "&verify=verify_peer&server_name_indication=localhost&auth_mechanism=external"
        "&heartbeat=10&connection_timeout=5000"
    )
    return f"amqps://{up.host}:{up.port}/{quote(topology.vhost(job_id), safe='')}?{query}"


def _user(name: str) -> dict[str, Any]:
    # Empty hash = no password (what `clear_password` sets): certificate login only.
    return {"name": name, "password_hash": "", "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": []}


def definitions(
    job_id: str,
    cluster: str,
    flows: Sequence[Flow],
    workers: Sequence[str],
    peers: Sequence[str],
    upstreams: Mapping[str, Upstream],
) -> dict[str, Any]:
    """The definitions document for ``cluster``; ``upstreams`` is keyed by source cluster."""
    vhost = topology.vhost(job_id)
    perms: dict[str, Permissions] = {}
    for p in peers:
        perms[federation_identity(p)] = federation_permissions(job_id, flows, cluster, p)
    for w in workers:
        try:
            perms[str(w)] = permissions(job_id, w, flows)
        except ValueError as exc:
            raise StackError(str(exc)) from None
    defs: dict[str, Any] = {
        "vhosts": [{"name": vhost}],
        "users": [_user(u) for u in perms],
        "permissions": [
            {"user": u, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}
            for u, p in perms.items()
        ],
        "parameters": [],
        "policies": [],
    }
    inbound: dict[str, list[str]] = {}
    for f in flows:
        if f.crosses_clusters and f.dst_cluster == cluster:
            inbound.setdefault(f.src_cluster, []).append(topology.queue_name(job_id, f.name))
    for src, names in sorted(inbound.items()):
        up = upstreams[src]
        defs["parameters"].append({
            "vhost": vhost, "component": "federation-upstream", "name": topology.upstream_name(src),
            "value": {
                "uri": upstream_uri(job_id, up), "ack-mode": ACK_MODE, "prefetch-count": PREFETCH,
                "resource-cleanup-mode": "never", "expires": EXPIRES_MS, "trust-user-id": False,
                # Seconds between reconnection attempts after a WAN cut (default 5).
                "reconnect-delay": RECONNECT_DELAY_S,
            },
        })
        name = topology.federation_policy(job_id)
        if len(inbound) > 1:
            name = f"{name}-{src}"
        defs["policies"].append({
            "vhost": vhost, "name": name, "pattern": _alternation(names), "apply-to": "queues",
            "priority": 0, "definition": {"federation-upstream": topology.upstream_name(src)},
        })
    return defs
