"""What a cluster's host does before its workers start, whoever starts them (``nebula-mq up``,
a user's own script through ``run_head``/``run_tail``): :func:`join`.

On a broker host: every peer cluster of the job trusted (:func:`trusted_peers`, which also reads
each peer's CRL again from its broker), the job provisioned on this cluster's broker
(:func:`provision_cluster`), and the job key and job file shared over the brokers, sealed
(:func:`share_job_key`). On a host of the cluster without its broker: the key waited for, as the
broker host's ``join`` writes it on the filesystem they share (:func:`wait_for_job_key`). On a
machine whose stack holds every cluster of the job: the job provisioned on all of them.

**The job key.** Every worker of a job signs and checks its envelopes with one key ring
(``<run_dir>/keys/job.key``, ``security.keys``). The first of the job's clusters by name holds
it: its ``nebula-mq up`` creates the ring if needed and sends each peer cluster a copy sealed
to that cluster's CA and signed by its own (``security.keys``) on a federated queue of the
key's own (``topology.key_flows``), as the job's key courier (an identity that may touch those
queues and nothing else). A peer's ``up`` that has no ring yet waits for its copy, checks the
signature against the CA it trusts, opens it with its CA key and writes the ring (mode 0600).
A peer that has a ring already refuses one that differs.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import tomllib
from base64 import b64decode, b64encode
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nebula_mq import topology
from nebula_mq.config import path_fields
from nebula_mq.errors import CertificateError, ConfigError, NebulaError, SecurityError
from nebula_mq.security.certs import federation_identity
from nebula_mq.security.keys import KeyRing, ensure_job_key, ensure_secret, job_key_file, seal, unseal
from nebula_mq.security.pem import write_private
from nebula_mq.stack import provision

# How long a peer's `up` waits for the sealed key before it says whose `up` to start.
KEY_WAIT_S = 300.0
# How often a waiting `up` says what it waits for, and how the links to the peer stand.
TELL_EVERY_S = 30.0


def share_job_key(settings: Any, plan: Any, cluster: str, stack: Any, wait_s: float = KEY_WAIT_S,
                  section: type | None = None, say: Callable[[str], None] = print) -> str:
    """Send (from the key's cluster) or receive (elsewhere) the job key; a line saying which.
    While it waits for the key, every :data:`TELL_EVERY_S` seconds ``say`` gets a line and the
    state of the links from the key's cluster (a link that cannot come up is named, not waited
    out in silence)."""
    from nebula_mq.transport.rabbit import RabbitTransport

    job_id = settings.job.id
    path = job_key_file(settings.run_dir)
    keys = topology.key_flows(plan.flows)
    if not keys:  # one cluster: the key never leaves it
        ensure_job_key(path, job_id)
        return f"job key {path}"
    origin = keys[0].src_cluster
    broker = stack.broker_settings(cluster, topology.key_courier(job_id), vhost=topology.vhost(job_id))
    ca = stack.ca(cluster)
    with RabbitTransport(broker, settings.transport, job_id, cluster) as transport:
        if cluster == origin:
            ensure_job_key(path, job_id)
            payload = json.dumps({"key": b64encode(path.read_bytes()).decode(),
                                  "job": Path(settings.source).read_text(encoding="utf-8")}).encode()
            _cert, signer = ca.keypair()
            with transport.publisher() as publisher:
                for flow in keys:
                    queue = transport.declare_flow(flow, "producer")
                    blob = seal(payload, ca.peer_ca(flow.dst_cluster).public_key(), signer,
                                f"{job_id}/{origin}/{flow.dst_cluster}")
                    publisher.publish(queue, blob, f"{job_id}.job-key.{flow.dst_cluster}.{time.time_ns()}")
            return f"job key {path}: sent sealed to {', '.join(f.dst_cluster for f in keys)}"
        flow = next(f for f in keys if f.dst_cluster == cluster)

        def links_down() -> list[str]:
            return [link.line() for link in stack.federation_links(cluster, topology.vhost(job_id))
                    if link.peer == origin and not link.up]

        def tell(waited: float) -> None:
            say(f"waiting for the job key from {origin} ({waited:.0f} s of {wait_s:g}): is `nebula-mq up` "
                f"running there?")
            for line in links_down():
                say(f"  {line}")

        received = _receive(transport, flow, ca, origin, f"{job_id}/{origin}/{cluster}",
                            wait_s if not path.exists() else 2.0, tell)
    if received is None:
        if path.exists():
            return f"job key {path} (kept)"
        down = links_down()
        if down:
            raise SecurityError(f"no job key from {origin} within {wait_s:g} s: {down[0]}")
        raise SecurityError(f"no job key from {origin} within {wait_s:g} s, though the link from it is up: "
                            f"start `nebula-mq up` for {origin} (it holds the key and sends it sealed to {cluster})")
    ring, their_job = _opened(received)
    same_job(settings, their_job, origin, section)
    if path.exists() and path.read_bytes() != ring:
        raise SecurityError(f"{path} differs from the job key {origin} sent: remove it to take {origin}'s, "
                            f"or check that both hosts run the same job")
    if not path.exists():
        write_private(path, ring)
    return f"job key {path}: received sealed from {origin}, with its job file (the same as {settings.source})"


def _opened(payload: bytes) -> tuple[bytes, str]:
    """The key ring and the job file's text the key's cluster sealed together."""
    try:
        body = json.loads(payload)
        return b64decode(body["key"]), str(body["job"])
    except (ValueError, KeyError, TypeError):
        raise SecurityError("the sealed job key holds no key ring and job file: are both sides the same "
                            "nebula-mq version?") from None


# What each side keeps in its own place: broker access and where files lie on its hosts.
LOCAL_KEYS = re.compile(r"^clusters\.[^.]+\.broker(\.|$)")


def same_job(settings: Any, their_text: str, origin: str, section: type | None) -> None:
    """This side's job file says what ``origin``'s says (``their_text``, sent with the key), but
    for what each side keeps in its own place (its broker table, its paths: ``section`` is the
    scenario section's schema); else a one-line ConfigError naming the first keys that differ,
    with ``origin``'s copy written beside the run dir to read or take."""
    own = tomllib.loads(Path(settings.source).read_text(encoding="utf-8"))
    try:
        theirs = tomllib.loads(their_text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}'s job file", "<syntax>", "valid TOML", str(exc)) from None
    paths = path_fields(type(settings)) | (path_fields(section) if section is not None else set())
    ours_flat, theirs_flat = _flat(own), _flat(theirs)
    differ = [k for k in sorted(set(ours_flat) | set(theirs_flat))
              if ours_flat.get(k) != theirs_flat.get(k) and not LOCAL_KEYS.match(k) and k.rsplit(".", 1)[-1] not in paths]
    if not differ:
        return
    copy = settings.run_dir.parent / f"{settings.run_dir.name}.{origin}.toml"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(their_text, encoding="utf-8")
    shown = "; ".join(f"{k} = {_value(ours_flat.get(k))} here, {_value(theirs_flat.get(k))} on {origin}"
                      for k in differ[:3]) + (f"; and {len(differ) - 3} more" if len(differ) > 3 else "")
    raise ConfigError(settings.source, differ[0], f"the job {origin} runs, as both data centres must run one job "
                      f"({shown}); {origin}'s copy is in {copy}: take it, or change it there", "another job")


def _flat(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _value(value: Any) -> str:
    return "(none)" if value is None else json.dumps(value)


def _receive(transport: Any, flow: topology.Flow, ca: Any, origin: str, context: str, wait_s: float,
             tell: Callable[[float], None]) -> bytes | None:
    """The newest sealed key on ``flow`` (every copy there is acked), opened; None if none came.
    A copy that does not open (not signed by ``origin``'s CA, another job's) is dropped, and its
    error raised if no good copy follows. ``tell`` hears how long it has waited, every
    :data:`TELL_EVERY_S` seconds of waiting."""
    queue = transport.declare_flow(flow, "consumer")
    consumer = transport.consume(queue, prefetch=16)
    _cert, own_key = ca.keypair()
    signer = ca.peer_ca(origin).public_key()
    newest: bytes | None = None
    refused: SecurityError | None = None
    started = told = time.monotonic()
    try:
        while True:
            delivery = consumer.get(timeout=1.0 if newest is None else 0.3)
            if delivery is None:
                now = time.monotonic()
                if newest is not None or now - started > wait_s:
                    break
                if now - told >= TELL_EVERY_S:
                    told = now
                    tell(now - started)
                continue
            try:
                newest = unseal(bytes(delivery.body), own_key, signer, context)
            except SecurityError as exc:
                refused = exc
            delivery.ack()  # opened or not, it is settled: a bad copy is not read again
    finally:
        consumer.close()
    if newest is None and refused is not None:
        raise refused
    return newest


def provision_cluster(settings: Any, plan: Any, cluster: str, stack: Any, password_file: str | None = None,
                      dry_run: bool = False, admin: Any = None, make_key: bool = True) -> tuple[dict[str, Any], str]:
    """Provision the job on ``cluster``'s broker: through this host's ``stack`` (its node as its
    administrator, its certificates the stack's own, issued here) or through ``admin`` (any
    broker's management API). Peers are where the job file's ``[clusters.<name>.federation]``
    says. Returns the definitions and a summary; ``dry_run`` changes nothing. ``make_key``:
    create the job key here when missing (:func:`join` leaves it to :func:`share_job_key`)."""
    identities = plan.identities(settings.job.id).get(cluster, ())
    peers = sorted(plan.clusters - {cluster})
    upstreams = provision.federation_upstreams(settings.clusters, cluster, plan.flows, settings.source)
    password_path = Path(password_file or settings.run_dir / "monitoring.password")
    if stack is not None:
        own = stack.ca(cluster).ensure_client(federation_identity(cluster))
        upstreams = {src: dataclasses.replace(up, client=own) for src, up in upstreams.items()}
        password_path = stack.monitoring_password_file(topology.vhost(settings.job.id))
    password = "<generated>" if dry_run else ensure_secret(password_path)
    defs = provision.definitions(settings.job.id, cluster, plan.flows, identities, peers, upstreams,
                                 settings.transport.max_queue_bytes, password)
    if dry_run:
        for user in defs["users"]:
            if user["password_hash"]:
                user["password_hash"] = "<hash of the monitoring password>"
        return defs, ""
    if stack is not None:
        for cn in identities:  # the workers' certificates, from this cluster's CA
            stack.ca(cluster).ensure_client(cn)
        admin = stack.admin(cluster)
    admin.import_definitions(defs)
    summary = (f"job {settings.job.id}: provisioned on {cluster} ({admin.name}): vhost {topology.vhost(settings.job.id)}, "
               f"{len(defs['users'])} users, {len(defs['queues'])} queues, "
               f"{len(defs['parameters'])} federation upstreams ({', '.join(sorted(upstreams)) or 'none'}); "
               f"monitoring user {topology.monitoring_user(settings.job.id)}, password in {password_path}")
    if not make_key:
        return defs, summary
    # Every worker of the job, on every host, signs and checks messages with the same job key.
    key = job_key_file(settings.run_dir)
    made = not key.exists()
    ensure_job_key(key, settings.job.id)
    return defs, (f"{summary}\njob key {key} ({'new' if made else 'kept'}): the job's workers on other hosts need "
                  f"this same file (`nebula-mq up` sends it sealed; else copy it there, mode 0600)")


# How often a broker host's supervisor reads its peers' CRLs again from their brokers' handshakes.
CRL_REFRESH_S = 3600.0


def trusted_peers(settings: Any, plan: Any, cluster: str, stack: Any,
                  say: Callable[[str], None] = print) -> Callable[[], None]:
    """Check that ``cluster`` trusts every peer cluster of the job (else one line saying which
    command makes it), refresh each one's CRL from its broker (``security.trust``), and return
    the refresh, for the supervisor to repeat while the job runs."""
    peers = sorted(plan.clusters - {cluster})
    where = {p: settings.clusters[p].federation for p in peers if p in settings.clusters}
    for peer in peers:
        try:
            stack.ca(cluster).peer_ca(peer)
        except CertificateError:
            fed = where.get(peer)
            address = f"{fed.host}:{fed.port}" if fed is not None and fed.host else "HOST:PORT"
            raise CertificateError(f"{cluster} does not trust {peer} yet: run `nebula-mq stack trust {peer} {address} "
                                   f"--fingerprint ...` on this host, as {peer}'s `stack up` printed it") from None

    def refresh() -> None:
        for peer, fed in where.items():
            if not fed.host:
                continue
            try:
                stack.trust_peer(cluster, peer, fed.host, fed.port, None)
            except NebulaError as exc:  # the link's own state says the rest (`status`)
                say(f"could not read {peer}'s CRL from {fed.host}:{fed.port} (the one held stays): {exc}")

    refresh()
    return refresh


def wait_for_job_key(settings: Any, broker_host: str, wait_s: float = KEY_WAIT_S,
                     say: Callable[[str], None] = print) -> str:
    """The job key, written by the broker host's :func:`join` on the filesystem the cluster's
    hosts share, once it is there (it makes or receives the key before it starts a worker);
    what it waits for is said every :data:`TELL_EVERY_S` seconds."""
    path = job_key_file(settings.run_dir)
    started = told = time.monotonic()
    while not path.exists():
        now = time.monotonic()
        if now - told >= TELL_EVERY_S:  # said before giving up too: a slow host still hears why
            told = now
            say(f"waiting for the job key that `nebula-mq up` on {broker_host} writes to {path} "
                f"({now - started:.0f} s of {wait_s:g}): is it running there, with this run_dir?")
        if now - started > wait_s:
            raise SecurityError(f"no job key at {path} after {wait_s:g} s: start `nebula-mq up` on {broker_host} "
                                f"first (it provisions the job), with the same run_dir on a filesystem both hosts share")
        time.sleep(0.5)
    ring = KeyRing.load(path)
    if ring.job_id != settings.job.id:
        raise SecurityError(f"{path}: key ring of job {ring.job_id!r}, not {settings.job.id!r}")
    return f"job key {path} (from {broker_host}'s `up`)"


def join(settings: Any, plan: Any, cluster: str, stack: Any, broker_host: str, section: type | None,
         say: Callable[[str], None] = print) -> Callable[[], None] | None:
    """This host's part before its workers of ``cluster`` start (see the module docstring);
    ``section``: the schema of the job's scenario section (what may differ between the two
    sides' job files). Returns what to repeat while the job runs (the peers' CRLs read again
    every :data:`CRL_REFRESH_S`), or None."""
    if broker_host:
        say(wait_for_job_key(settings, broker_host, say=say))
        return None
    if plan.clusters <= set(stack.clusters):  # one machine holds the whole job: its relays link the clusters
        ensure_job_key(job_key_file(settings.run_dir), settings.job.id)
        stack.provision_job(settings.job.id, plan.flows, plan.identities(settings.job.id),
                            max_queue_bytes=settings.transport.max_queue_bytes)
        say(f"job {settings.job.id}: provisioned on every cluster of the stack in {stack.layout.run_dir}")
        return None
    refresh = trusted_peers(settings, plan, cluster, stack, say)
    say(provision_cluster(settings, plan, cluster, stack, make_key=False)[1])
    say(share_job_key(settings, plan, cluster, stack, section=section, say=say))
    return refresh
