"""Flows and the names of every broker object, declared in one place.

A *flow* is a one-way stream of envelopes from a role on one cluster to a role
on the same or another cluster. Every queue, exchange, policy and vhost name is
derived here from the job id, so no other module builds names by hand.

How a cross-cluster flow is laid out (RabbitMQ 3.10, see docs/rabbitmq.md):

* The sender's cluster holds the **upstream copy** of the flow's queue: a classic
  durable queue, bounded with ``max-length-bytes`` and ``overflow:
  reject-publish``. A full queue nacks the publish, so the producer waits and
  retries. This is the only cap: it sits on the sending side of the WAN. The
  cap is a *policy* (:func:`cap_policy`), not a queue argument: the federation
  link declares the upstream queue itself, with the downstream copy's
  arguments, whenever the receiver starts first, so arguments must be equal on
  both copies and the cap can only come from a policy.
* The receiver's cluster holds the **downstream copy** with the same name, made
  a *federated queue* by policy. Queue federation only pulls messages across the
  WAN while the downstream queue has consumers with spare prefetch, so a stalled
  consumer stops the pull, the upstream copy fills, and the producer is nacked:
  backpressure crosses the WAN without a cap downstream (capping downstream makes
  the link loop, see docs/rabbitmq.md).
* Classic durable queues, not quorum queues: on 3.10 a federated quorum queue's
  link is not recreated after a node restart. Not streams: a stream's retention
  drops old segments instead of refusing publishes, which would lose data.

Replies (decoder -> encoder) are a flow of their own in the other direction,
one reply queue per requester, so ``reply_to`` names a durable queue that exists
on both clusters (direct reply-to does not cross federation on 3.10).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum

PREFIX = "nebula"
#: Most queues one flow may be striped over (``Flow.stripes``).
MAX_STRIPES = 16

_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class FlowKind(str, Enum):
    TENSORS = "tensors"  # micro-batch results, activations, gradients
    SYNC = "sync"  # sync tokens that keep both sides at the same step
    REPLY = "reply"  # replies to a request flow, per requester


@dataclass(frozen=True)
class Flow:
    """One directed message stream of a job."""

    # Short name, unique within a job: travels in every envelope's ``flow`` field.
    name: str
    # Cluster whose workers publish to this flow (holds the bounded upstream copy).
    src_cluster: str
    # Cluster whose workers consume it; equal to src_cluster for a local flow.
    dst_cluster: str
    kind: FlowKind = FlowKind.TENSORS
    # Queues the flow is striped over, each with its own federation link (its own TCP and TLS
    # connection between the brokers): message ``i`` travels on stripe ``i % stripes``, and the
    # consumer restores the order by micro-batch. See :func:`stripe_flows`.
    stripes: int = 1

    @property
    def crosses_clusters(self) -> bool:
        return self.src_cluster != self.dst_cluster


def stripe_flows(flow: Flow) -> tuple[Flow, ...]:
    """The physical flows a flow is striped over, stripe ``j`` at index ``j``.

    Stripe 0 is the flow itself, so a flow of one stripe is laid out exactly as before striping
    existed; stripe ``j > 0`` is the flow ``<name>-s<j>``, with its own queue, exchange and
    federation link. Provisioning, permissions and declares work on these (:func:`physical_flows`);
    envelopes carry the stripe's name, so each stripe's consumer checks its own messages.
    """
    if not 1 <= flow.stripes <= MAX_STRIPES:
        raise ValueError(f"flow {flow.name!r}: stripes must be in 1..{MAX_STRIPES}, got {flow.stripes}")
    extra = tuple(replace(flow, name=_check(f"{flow.name}-s{j}", "striped flow name"), stripes=1)
                  for j in range(1, flow.stripes))
    return (flow, *extra)


def stripe_of(flow: Flow, micro_batch: int) -> Flow:
    """The stripe that carries ``micro_batch``: the same one every time, so a message sent again
    after a restart lands where its first copy did and is deduplicated there."""
    return stripe_flows(flow)[micro_batch % flow.stripes]


def physical_flows(flows: Iterable[Flow]) -> tuple[Flow, ...]:
    """Every stripe of every flow: what a job provisions, and what its roles may touch."""
    return tuple(s for f in flows for s in stripe_flows(f))


def _check(slug: str, what: str) -> str:
    if not _SLUG.match(slug):
        raise ValueError(f"{what} must match [a-z0-9][a-z0-9-]{{0,62}}, got {slug!r}")
    return slug


def vhost(job_id: str) -> str:
    """Each job runs in its own vhost on every cluster (isolation)."""
    return f"{PREFIX}-{_check(job_id, 'job id')}"


def job_of_vhost(name: str) -> str | None:
    """The job whose vhost is ``name``; None for a vhost of no job (such as "/")."""
    head = f"{PREFIX}-"
    job_id = name[len(head):] if name.startswith(head) else ""
    return job_id if _SLUG.match(job_id) else None


def queue_name(job_id: str, flow: str) -> str:
    """Name of a flow's queue; the same on both clusters of a cross-cluster flow."""
    return f"{PREFIX}.{_check(job_id, 'job id')}.{_check(flow, 'flow name')}"


def dead_letter_queue(job_id: str) -> str:
    """Where a cluster puts messages its consumers condemned, with the reason in headers."""
    return f"{PREFIX}.{_check(job_id, 'job id')}.dead-letter"


def flow_exchange(job_id: str, flow: str) -> str:
    """Direct exchange a flow is published through, bound to the flow's queue (key = queue name).

    Provisioned on the flow's source cluster; a role gets write on the exchanges of
    the flows it publishes to and nothing else, because RabbitMQ checks publish
    rights on the exchange, never on the queue (``amq.default`` reaches every queue).
    """
    return exchange_for_queue(queue_name(job_id, flow))


def dead_letter_exchange(job_id: str) -> str:
    """Direct exchange into the job's dead-letter queue, on every cluster."""
    return exchange_for_queue(dead_letter_queue(job_id))


_OUR_QUEUE = re.compile(rf"^{PREFIX}\.[a-z0-9][a-z0-9-]{{0,62}}\.[a-z0-9][a-z0-9-]{{0,62}}$")


def exchange_for_queue(queue: str) -> str:
    """The exchange that publishes into ``queue`` (a flow's queue, a ``reply_to`` or the
    dead-letter queue). The ``.x`` suffix keeps exchange names out of every queue regex.
    :class:`ValueError` for a name outside this layout."""
    if not _OUR_QUEUE.match(queue):
        raise ValueError(f"{queue!r} is not a queue of the nebula layout")
    return f"{queue}.x"


def federation_policy(job_id: str) -> str:
    return f"{PREFIX}-{_check(job_id, 'job id')}-federate"


def cap_policy(job_id: str) -> str:
    """Policy bounding the upstream copies of a cluster's outbound cross-cluster flows."""
    return f"{PREFIX}-{_check(job_id, 'job id')}-cap"


def status_exchange(job_id: str) -> str:
    """Fanout exchange every worker of the job publishes its status to, on every cluster; each
    cluster's copy is federated from its peers' (max-hops 1), so every cluster sees every worker."""
    return f"{PREFIX}.{_check(job_id, 'job id')}.status.x"


def status_stream(job_id: str) -> str:
    """The stream (a non-destructive, replayable queue) bound to the status exchange on every
    cluster: ``nebula-mq status --feed`` reads the last messages of every worker from it."""
    return f"{PREFIX}.{_check(job_id, 'job id')}.status"


def status_policy(job_id: str) -> str:
    """Policy federating the status exchange from every upstream of the cluster."""
    return f"{PREFIX}-{_check(job_id, 'job id')}-status"


def status_reader(job_id: str) -> str:
    """The certificate CN that may read the status stream and nothing else."""
    return f"{_check(job_id, 'job id')}.status-reader"


def key_flows(flows: Iterable[Flow]) -> tuple[Flow, ...]:
    """The flows that carry the job key, sealed, from the key's cluster (the first of the job's
    clusters by name) to each other cluster (``security.keys``); none for a one-cluster job."""
    clusters = sorted({c for f in flows for c in (f.src_cluster, f.dst_cluster)})
    return tuple(Flow(f"job-key-{dst}", clusters[0], dst, FlowKind.SYNC) for dst in clusters[1:])


def key_courier(job_id: str) -> str:
    """The certificate CN that carries the sealed job key: it publishes the key's flows on the
    key's cluster and consumes its own on the others, nothing else."""
    return f"{_check(job_id, 'job id')}.key-courier"


def monitoring_user(job_id: str) -> str:
    """The job's read-only user of the brokers' management API (queue sizes, the live view)."""
    return f"{PREFIX}-monitor-{_check(job_id, 'job id')}"


def upstream_name(cluster: str) -> str:
    """Name of the federation upstream that points at ``cluster``'s broker."""
    return f"{PREFIX}-upstream-{_check(cluster, 'cluster name')}"


def upstream_cluster(upstream: str) -> str:
    """The cluster an upstream named by :func:`upstream_name` points at (another name as is)."""
    return upstream.removeprefix(f"{PREFIX}-upstream-")


def message_id(job_id: str, flow: str, producer: str, seq: int) -> str:
    """Identity of a message: its place in its producer's stream on the flow. Consumers
    discard redeliveries that repeat one; a recomputed message has the same id. (Two
    producers may share a flow, so the producer is part of it; step and micro-batch
    are fields of the envelope, not of its identity.)"""
    return f"{job_id}/{flow}/{producer}/{seq}"


# -------------------------------------- request/reply flows of a split model (the split and abnet scenarios)


def reply_flow(requester: str) -> str:
    """Reply flow of one requester (an encoder worker id)."""
    return f"reply-{_check(requester, 'requester id')}"


def activation_flow(tail_rank: int | None = None) -> str:
    """Activations of a split model: to its one tail process (``None``), or to tail rank
    ``j``'s own flow when the tail side has several ranks."""
    return "activations" if tail_rank is None else f"activations-{tail_rank}"


def abnet_flows(src_cluster: str, tgt_cluster: str, requesters: tuple[str, ...],
                tail_ranks: int = 1, stripes: int = 1) -> tuple[Flow, ...]:
    """Scenario II and split models: encoder (head) activations S -> T as requests, one flow
    per tail rank; gradient replies T -> S, one flow per requester (head rank); each striped over
    ``stripes`` queues (logical flows: :func:`physical_flows` lists their stripes)."""
    flows = [Flow(activation_flow(j if tail_ranks > 1 else None), src_cluster, tgt_cluster, stripes=stripes)
             for j in range(tail_ranks)]
    flows += [Flow(reply_flow(r), tgt_cluster, src_cluster, FlowKind.REPLY, stripes=stripes) for r in requesters]
    return tuple(flows)
