"""The job key reaches every cluster of a job over the brokers, sealed: no one copies it by hand.

Every worker of a job signs and checks its envelopes with one key ring
(``<run_dir>/keys/job.key``, ``security.keys``). The first of the job's clusters by name holds
it: its ``nebula-mq up`` creates the ring if needed and sends each peer cluster a copy sealed
to that cluster's CA and signed by its own (``security.sealing``) on a federated queue of the
key's own (``topology.key_flows``), as the job's key courier (an identity that may touch those
queues and nothing else). A peer's ``up`` that has no ring yet waits for its copy, checks the
signature against the CA it trusts, opens it with its CA key and writes the ring (mode 0600).
A peer that has a ring already refuses one that differs.
"""

from __future__ import annotations

import json
import re
import time
from base64 import b64decode, b64encode
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nebula_mq import topology
from nebula_mq.errors import ConfigError, SecurityError
from nebula_mq.security.keys import ensure_job_key, job_key_file
from nebula_mq.security.pem import write_private
from nebula_mq.security.sealing import seal, unseal

# How long a peer's `up` waits for the sealed key before it says whose `up` to start.
KEY_WAIT_S = 300.0
# How often a waiting `up` says what it waits for, and how the links to the peer stand.
TELL_EVERY_S = 30.0


def share_job_key(settings: Any, plan: Any, cluster: str, stack: Any, wait_s: float = KEY_WAIT_S,
                  say: Callable[[str], None] = print) -> str:
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
    same_job(settings, their_job, origin)
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


def same_job(settings: Any, their_text: str, origin: str) -> None:
    """This side's job file says what ``origin``'s says (``their_text``, sent with the key), but
    for what each side keeps in its own place (its broker table, its paths); else a one-line
    ConfigError naming the first keys that differ, with ``origin``'s copy written beside the
    run dir to read or take."""
    import tomllib

    from nebula_mq.config import path_fields
    from workers.registry import scenario_named

    own = tomllib.loads(Path(settings.source).read_text(encoding="utf-8"))
    try:
        theirs = tomllib.loads(their_text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}'s job file", "<syntax>", "valid TOML", str(exc)) from None
    paths = path_fields(type(settings)) | path_fields(scenario_named(settings.job.scenario).section)
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
