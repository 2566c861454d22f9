"""Least-privilege broker permissions per worker role, derived from ``nebula_mq.topology``.

A :class:`WorkerIdentity` is a certificate CN (it *is* a ``str``, so it goes
wherever the stack expects a CN: ``Stack.provision_job(job, flows,
{"cluster-a": [WorkerIdentity("enc-0", ("activations",), ("reply-enc-0",))]})``)
that also names the flows its role publishes to and consumes from; a job plan's
processes give theirs (``workers.processes.Process.broker_identity``). Provisioning turns that into exact RabbitMQ
regexes (:func:`permissions`):

* configure: the queues of those flows and the job's dead-letter queue (the
  worker declares them, with the arguments of ``transport.declare``);
* write: the exchanges of the flows it publishes to
  (``topology.flow_exchange``) and, for a role that consumes, the dead-letter
  exchange, nothing else. A consumer condemns a message itself: the transport
  republishes it to the dead-letter exchange with the ``x-nebula-reason`` and
  ``x-nebula-detail`` headers, then acks it (``transport.consumer``); the
  broker's own dead-lettering (a reject, without write permission) cannot add
  them. A role that only publishes receives nothing to condemn, so it has no
  write on the dead-letter exchange. Each dead letter a worker condemns is
  audited (``message_dead_lettered``, ``workers.base``). RabbitMQ checks publish rights
  on the *exchange*, never on the queue, so write on ``amq.default`` would let
  a role publish into every queue of the job; each flow's direct exchange is
  bound to that flow's queue only (provisioned by ``stack.provision``). No
  write on queues either: a role cannot bind anything (binding needs write on
  the queue and read on the exchange);
* read: the queues it consumes, nothing else.

Exchange names end in ``.x``, so no queue regex ever matches an exchange (the
configure and read regexes apply to exchanges too).

A plain ``str`` identity keeps the older job-wide permissions (every queue and
flow exchange of the job, and ``amq.default``) for tools and tests that act as
several roles at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nebula_mq import topology
from nebula_mq.topology import Flow

NOTHING = "^$"  # a permission pattern that matches no resource


class WorkerIdentity(str):
    """A CN plus the flow names its role publishes (``publishes``) and consumes (``consumes``)."""

    publishes: tuple[str, ...]
    consumes: tuple[str, ...]

    def __new__(cls, cn: str, publishes: Iterable[str] = (), consumes: Iterable[str] = ()) -> WorkerIdentity:
        obj = super().__new__(cls, cn)
        obj.publishes = tuple(publishes)
        obj.consumes = tuple(consumes)
        return obj

    def __reduce__(self) -> tuple[object, ...]:
        return (WorkerIdentity, (str(self), self.publishes, self.consumes))


@dataclass(frozen=True)
class Permissions:
    """One user's regexes in one vhost."""

    configure: str
    write: str
    read: str


def alternation(names: Iterable[str]) -> str:
    """A regex matching exactly ``names`` (:data:`NOTHING` for none)."""
    names = sorted(set(names))
    return "^(" + "|".join(re.escape(n) for n in names) + ")$" if names else NOTHING


def permissions(job_id: str, identity: str, flows: Sequence[Flow]) -> Permissions:
    """Regexes for ``identity`` in the job's vhost; :class:`ValueError` if it names unknown flows."""
    known = {f.name for f in flows}
    dlq = topology.dead_letter_queue(job_id)
    dlx = topology.dead_letter_exchange(job_id)
    status = topology.status_exchange(job_id)  # every worker publishes its status (no queue to bind)
    if not isinstance(identity, WorkerIdentity):
        every = [topology.queue_name(job_id, f) for f in known] + [dlq]
        exchanges = [topology.flow_exchange(job_id, f) for f in known] + [dlx, status, "amq.default"]
        return Permissions(alternation(every), alternation([*every, *exchanges]), alternation(every))
    unknown = set(identity.publishes + identity.consumes) - known
    if unknown:
        raise ValueError(f"identity {str(identity)!r} names flows {sorted(unknown)} not in job {job_id!r}")
    pub = [topology.queue_name(job_id, f) for f in identity.publishes]
    sub = [topology.queue_name(job_id, f) for f in identity.consumes]
    pub_exchanges = [topology.flow_exchange(job_id, f) for f in identity.publishes]
    condemns = [dlx] if identity.consumes else []  # only a consumer dead-letters (module doc)
    return Permissions(alternation([*pub, *sub, dlq]), alternation([*pub_exchanges, *condemns, status]),
                       alternation(sub))


def federation_permissions(job_id: str, flows: Sequence[Flow], cluster: str, peer: str) -> Permissions:
    """The peer broker's federation user on ``cluster``: it may only pull flows ``cluster`` -> ``peer``,
    and the status exchange, through the buffer exchange and queue its exchange link declares
    here (``federation: <status exchange> -> ...``) and binds to the status exchange."""
    out = [topology.queue_name(job_id, f.name) for f in flows if f.src_cluster == cluster and f.dst_cluster == peer]
    status = topology.status_exchange(job_id)
    link = f"federation: {re.escape(status)} -> .*"
    queues = "|".join(re.escape(n) for n in sorted(set(out)))
    own = f"^({queues + '|' if queues else ''}{link})$"
    return Permissions(own, f"^({link})$", f"^({queues + '|' if queues else ''}{re.escape(status)}|{link})$")


def status_reader_permissions(job_id: str) -> Permissions:
    """``topology.status_reader``'s: read the status stream, nothing else (a stream consumer
    declares nothing and acks only what it read)."""
    return Permissions(NOTHING, NOTHING, alternation([topology.status_stream(job_id)]))


def dead_letter_auditor(job_id: str) -> str:
    """The CN ``nebula-mq audit dead-letters`` reads a cluster's dead-letter queue as."""
    topology.vhost(job_id)  # validates the job id
    return f"{job_id}.dead-letter-auditor"


def dead_letter_auditor_permissions(job_id: str) -> Permissions:
    """:func:`dead_letter_auditor`'s: read the dead-letter queue (``basic.get``, then a nack with
    requeue, which is not permission-checked), nothing else."""
    return Permissions(NOTHING, NOTHING, alternation([topology.dead_letter_queue(job_id)]))


def dead_letter_writers(job_id: str, identities: Iterable[str], flows: Sequence[Flow]) -> frozenset[str]:
    """Those of ``identities`` whose permissions let them publish into the dead-letter exchange:
    the roles that consume (and a plain CN, with the job's every right)."""
    dlx = topology.dead_letter_exchange(job_id)
    return frozenset(str(i) for i in identities if re.fullmatch(permissions(job_id, i, flows).write, dlx))
