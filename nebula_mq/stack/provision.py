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
* the publish path (``topology.flow_exchange``): for each flow published on C,
  a durable direct exchange bound to the flow's queue (routing key = queue
  name), and the same for the dead-letter queue; roles get write on these
  exchanges only (``security.roles``), so nobody publishes into a queue it has
  no flow to. A binding needs its queue, so those queues are created here too,
  with exactly the arguments ``transport.declare`` gives them (a worker's later
  declare with other arguments fails with 406): classic + lazy for both copies
  of a cross-cluster flow and the dead-letter queue, plus the cap for a local
  flow (``max_queue_bytes`` must be the workers' ``TransportSettings`` value).
  Deleting a queue drops its binding: provision again after that;
* the job's monitoring user ``topology.monitoring_user(job)``: a password login for the
  management API only (tag ``management``), with permissions that match nothing, so it
  sees the job's vhost and its queues and can change, publish or consume nothing;
* the job's *incarnation* marker on C: an internal exchange with a fresh token per
  provisioning (``transport.job_presence``). A broker wiped and provisioned again lacks the
  markers its workers noted beside their checkpoints, so they stop with ``BrokerDataLost``
  instead of waiting for messages it no longer holds;
* for each cluster ``S`` that has flows *into* C: upstream ``nebula-upstream-S``
  pointing at S through the emulated WAN relay, and a policy making exactly those
  flows' queues federated queues here. Flows whose destination is not C never
  match C's policy: their copy on C is the upstream one.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from nebula_mq import topology
from nebula_mq.errors import ConfigError, StackError
from nebula_mq.security.certs import Identity, federation_identity
from nebula_mq.security.roles import (NOTHING, Permissions, WorkerIdentity, alternation, federation_permissions,
                                      permissions, status_reader_permissions)
from nebula_mq.settings import TransportSettings
from nebula_mq.transport import declare
from nebula_mq.transport.job_presence import incarnation_exchange, new_incarnation
from nebula_mq.topology import Flow

# Federation link tuning (docs/rabbitmq.md): on-confirm loses nothing; never clean up the
# upstream buffer on a downstream stop; small prefetch for MB-sized tensors.
ACK_MODE = "on-confirm"
PREFETCH = 16
EXPIRES_MS = 7 * 24 * 3600 * 1000
RECONNECT_DELAY_S = 1  # a healed WAN carries traffic again within ~1 s (issue: resume < 2 s)
# The link's AMQP heartbeat. Each end checks once an interval and gives up at the second silent
# check in a row (20-30 s of silence at 10 s, measured), so a WAN drop shorter than that resets
# nothing: the link carries messages again one way's delay after the heal. Not longer: on a real
# link a drop it rides out costs up to one TCP backoff interval after the heal, which past ~20 s
# of backoff exceeds a reconnect's ~10 round trips (and a dead peer is noticed later).
HEARTBEAT_S = 10
# How long one connection attempt may take before the link gives it up and tries again. It
# covers the handshake's ~10 round trips (TLS, AMQP, channels, declare, consume): 4 s at 200 ms
# each way, so 5 s let an attempt that got through late in its time die mid-handshake. After a
# WAN drop longer than the heartbeat, the attempt waiting when the link came back then finishes
# instead of starting over: heal -> first message 4.72 -> 4.22 s at 200 ms each way (45 s drop,
# bench transport --recovery; cuts unchanged, 4.47 -> 4.37 s). The relay answers an attempt's
# SYN at once and holds it; over a real blackhole the SYN is lost, and the attempt waiting at the
# heal gets through only at its next SYN retry (Linux retries at 1, 3, 7, 15 s): a longer timeout
# keeps such an attempt alive longer and can add seconds after the heal that the relay cannot show.
CONNECTION_TIMEOUT_MS = 15000


@dataclass(frozen=True)
class Upstream:
    """How cluster ``dst``'s broker reaches the broker of cluster ``src``."""

    src: str
    host: str
    # src's AMQPS port as dst sees it (on the local stack: the relay that emulates the WAN).
    port: int
    # dst's federation client identity, trusted by src: file paths on dst's broker host.
    client: Identity
    # The name in src's server certificate (SNI and the hostname check).
    server_name: str = "localhost"


def upstream_uri(job_id: str, up: Upstream) -> str:
    c = up.client
    query = (
        f"cacertfile={c.ca_file}&certfile={c.cert_file}&keyfile={c.key_file}"
        f"&verify=verify_peer&server_name_indication={up.server_name}&auth_mechanism=external"
        f"&heartbeat={HEARTBEAT_S}&connection_timeout={CONNECTION_TIMEOUT_MS}"
    )
    return f"amqps://{up.host}:{up.port}/{quote(topology.vhost(job_id), safe='')}?{query}"


def _user(name: str, password_hash: str = "", tags: Sequence[str] = ()) -> dict[str, Any]:
    # Empty hash = no password (what `clear_password` sets): certificate login only.
    return {"name": name, "password_hash": password_hash, "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": list(tags)}


def password_hash(user: str, password: str) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt + sha256(salt + password)), as
    ``rabbitmqctl add_user`` stores it. The 4-byte salt comes from the user and the password
    (not at random), so provisioning again writes the same definitions (idempotent)."""
    salt = hashlib.sha256(f"{user}\0{password}".encode()).digest()[:4]
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def publish_path(job_id: str, cluster: str, flows: Sequence[Flow], max_queue_bytes: int) -> dict[str, Any]:
    """Exchanges, queues and bindings through which ``cluster``'s workers publish."""
    vhost = topology.vhost(job_id)
    routes: list[tuple[str, str, dict[str, Any]]] = []  # (exchange, queue, queue arguments)
    for f in flows:
        if f.src_cluster != cluster:
            continue
        args = (declare.federated_copy_arguments() if f.crosses_clusters
                else declare.bounded_queue_arguments(max_queue_bytes))
        routes.append((topology.flow_exchange(job_id, f.name), topology.queue_name(job_id, f.name), args))
    routes.append((topology.dead_letter_exchange(job_id), topology.dead_letter_queue(job_id),
                   declare.dead_letter_arguments()))
    return {
        "exchanges": [{"name": x, "vhost": vhost, "type": "direct", "durable": True, "auto_delete": False,
                       "internal": False, "arguments": {}} for x, _, _ in routes],
        "queues": [{"name": q, "vhost": vhost, "durable": True, "auto_delete": False, "arguments": a}
                   for _, q, a in routes],
        "bindings": [{"source": x, "vhost": vhost, "destination": q, "destination_type": "queue",
                      "routing_key": q, "arguments": {}} for x, q, _ in routes],
    }


# How long the status stream keeps messages: enough for `status --feed` to find the last word of
# a worker that went silent, small enough to stay a few MB (a message every 10 s per worker).
STATUS_MAX_AGE = "6h"


def status_feed(defs: dict[str, Any], job_id: str) -> None:
    """Add the job's status exchange (fanout) and the stream bound to it (``topology``)."""
    vhost = topology.vhost(job_id)
    exchange, stream = topology.status_exchange(job_id), topology.status_stream(job_id)
    defs["exchanges"].append({"name": exchange, "vhost": vhost, "type": "fanout", "durable": True,
                              "auto_delete": False, "internal": False, "arguments": {}})
    defs["queues"].append({"name": stream, "vhost": vhost, "durable": True, "auto_delete": False,
                           "arguments": {"x-queue-type": "stream", "x-max-age": STATUS_MAX_AGE}})
    defs["bindings"].append({"source": exchange, "vhost": vhost, "destination": stream,
                             "destination_type": "queue", "routing_key": "", "arguments": {}})


def definitions(
    job_id: str,
    cluster: str,
    flows: Sequence[Flow],
    workers: Sequence[str],
    peers: Sequence[str],
    upstreams: Mapping[str, Upstream],
    max_queue_bytes: int = TransportSettings().max_queue_bytes,
    monitoring_password: str = "",
    incarnation: str | None = None,
) -> dict[str, Any]:
    """The definitions document for ``cluster``; ``upstreams`` is keyed by source cluster.
    With a ``monitoring_password``, it also holds the job's read-only monitoring user.
    ``incarnation``: the marker's token (None: a fresh one; "": no marker)."""
    vhost = topology.vhost(job_id)
    keys = topology.key_flows(flows)
    flows = (*flows, *keys)  # the job key crosses on flows of its own (stack.provision key flows)
    perms: dict[str, Permissions] = {}
    for p in peers:
        perms[federation_identity(p)] = federation_permissions(job_id, flows, cluster, p)
    if keys:
        courier = WorkerIdentity(topology.key_courier(job_id), [f.name for f in keys if f.src_cluster == cluster],
                                 [f.name for f in keys if f.dst_cluster == cluster])
        perms[str(courier)] = permissions(job_id, courier, flows)
    for w in workers:
        try:
            perms[str(w)] = permissions(job_id, w, flows)
        except ValueError as exc:
            raise StackError(str(exc)) from None
    perms[topology.status_reader(job_id)] = status_reader_permissions(job_id)
    defs: dict[str, Any] = {
        "vhosts": [{"name": vhost}],
        "users": [_user(u) for u in perms],
        "permissions": [
            {"user": u, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}
            for u, p in perms.items()
        ],
        **publish_path(job_id, cluster, flows, max_queue_bytes),
        "parameters": [],
        "policies": [],
    }
    status_feed(defs, job_id)
    token = new_incarnation() if incarnation is None else incarnation
    if token:  # internal: nobody publishes into it; it only says which provisioning made this copy
        defs["exchanges"].append({"name": incarnation_exchange(job_id, token), "vhost": vhost, "type": "fanout",
                                  "durable": True, "auto_delete": False, "internal": True, "arguments": {}})
    if monitoring_password:
        monitor = topology.monitoring_user(job_id)
        defs["users"].append(_user(monitor, password_hash(monitor, monitoring_password), tags=("management",)))
        defs["permissions"].append({"user": monitor, "vhost": vhost, "configure": NOTHING, "write": NOTHING,
                                    "read": NOTHING})
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
            "vhost": vhost, "name": name, "pattern": alternation(names), "apply-to": "queues",
            "priority": 0, "definition": {"federation-upstream": topology.upstream_name(src)},
        })
    if inbound:  # the status exchange pulls from every upstream this cluster has
        defs["policies"].append({
            "vhost": vhost, "name": topology.status_policy(job_id),
            "pattern": alternation([topology.status_exchange(job_id)]), "apply-to": "exchanges", "priority": 0,
            "definition": {"federation-upstream-set": "all"},
        })
    # The backpressure point: the sending-side copy of each cross-cluster flow published here
    # (never a queue downstream of a federation link: docs/rabbitmq.md, "Backpressure").
    outbound = [topology.queue_name(job_id, f.name) for f in flows if f.crosses_clusters and f.src_cluster == cluster]
    if outbound:
        defs["policies"].append({
            "vhost": vhost, "name": topology.cap_policy(job_id), "pattern": alternation(outbound),
            "apply-to": "queues", "priority": 0,
            "definition": {"max-length-bytes": max_queue_bytes, "overflow": "reject-publish"},
        })
    return defs


def federation_upstreams(clusters: Mapping[str, Any], cluster: str, flows: Sequence[Flow],
                         source: str = "<job>") -> dict[str, Upstream]:
    """The upstreams ``cluster``'s broker needs, from a job's ``[clusters.<name>.federation]``
    tables (``settings.ClusterSettings``): one per cluster that has flows into ``cluster``, at
    that cluster's public address, with ``cluster``'s own federation identity (its files on
    ``cluster``'s broker host). A cluster the job does not describe is a ConfigError's job."""
    here = clusters.get(cluster)
    flows = (*flows, *topology.key_flows(flows))
    sources = sorted({f.src_cluster for f in flows if f.crosses_clusters and f.dst_cluster == cluster})
    out = {}
    for src in sources:
        peer = clusters.get(src)
        if peer is None or not peer.federation.host:
            raise ConfigError(source, f"[clusters.{src}.federation].host",
                              f"the address at which {cluster}'s broker reaches {src}'s broker (a hostname)")
        cert_dir = Path((here.federation.cert_dir if here is not None else "") or "/etc/rabbitmq/certs/federation")
        client = Identity(federation_identity(cluster), cert_dir / "cert.pem", cert_dir / "key.pem",
                          cert_dir / "trust.pem")
        out[src] = Upstream(src, peer.federation.host, peer.federation.port, client, peer.federation.sni)
    return out
