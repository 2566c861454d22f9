"""What crosses the WAN in a replicas job: a cluster's pseudo-gradients out, the others' in.

Only a cluster's rank 0 holds one (``workers.replicas.replica.Replica``). Each event's pseudo-gradient
is encoded once (``workers.replicas.compression``: error feedback kept per parameter) and
published to every other cluster as micro-batch ``event``, with the digest of the outer
weights it started from; the coordinator's choice of the event's members
(``nebula_mq.membership.quorum``) or the election's messages (``membership.election``) go on
flows of their own. On the way in, every member's
pseudo-gradient is checked against this replica's outer weights, decoded and averaged in
cluster order, this replica's own included as the others decode it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nebula_mq.codecs import parse_codec
from nebula_mq.codecs.flow import EncodedTensors
from nebula_mq.errors import WorkerError
from nebula_mq.membership.election import ACCEPT, KIND
from nebula_mq.membership.election import PRODUCER as ELECTION
from nebula_mq.membership.quorum import MEMBERS, PRODUCER, Members, bits
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.worker import Worker
from workers.replicas.compression import PseudoGradientCompression
from workers.replicas.job import ReplicasJob, elect_flow, pseudograd_flow, quorum_flow
from workers.replicas.outer import Arrays, average

RAW = parse_codec("none")  # what goes as it is: the election's integers, the averages to a cluster's ranks
START = "start"  # the meta key of a pseudo-gradient's message: the digest of the weights it started from


def check_start(worker_id: str, event: int, parts: Sequence[Received], mine: str) -> None:
    """Every part started from the outer weights whose digest is ``mine``, or the job stops."""
    for p in parts:
        if p.meta.get(START) != mine:
            raise WorkerError(f"{worker_id}: event {event}: {p.envelope.producer} started from other weights "
                              "than this replica (the model must be built the same on every cluster and rank)")


class WanExchange:
    """Replica ``index``'s pseudo-gradients across the WAN (see the module docstring)."""

    def __init__(self, job: ReplicasJob, index: int, worker: Worker) -> None:
        self.job, self.index, self.worker = job, index, worker
        self.compression = PseudoGradientCompression(job.codec, job.error_feedback,
                                                     worker.settings.codec.allow_non_finite)
        self.own: Arrays = {}  # the event's pseudo-gradient as every receiver decodes it
        self.outboxes: list[Outbox] = []
        self.choices: list[Outbox] = []  # the coordinator's, with a quorum
        self.elections: dict[int, Outbox] = {}  # to every other cluster, with an elected coordinator
        self.told = time.time_ns() // 1000  # election messages' numbers: new in every life

    def open(self) -> None:
        job, peers = self.job, self.job.peers(self.index)
        self.outboxes = [Outbox(self.worker, pseudograd_flow(job, self.index, d), self.worker.worker_id) for d in peers]
        if self.index == 0 and job.first_chooses:
            self.choices = [Outbox(self.worker, quorum_flow(job, d), PRODUCER) for d in peers]
        if job.elected:
            self.elections = {d: Outbox(self.worker, elect_flow(job, self.index, d), ELECTION) for d in peers}

    def close(self) -> None:
        for outbox in self.outboxes + self.choices + list(self.elections.values()):
            outbox.close()

    def tell(self, dst: int, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """One election message to cluster ``dst``, numbered apart from every other. A proposal
        goes once this cluster's own pseudo-gradient is on its broker: an event decided with a
        member whose pseudo-gradient died with it would wait for it to come back."""
        if meta.get(KIND) == ACCEPT:
            for outbox in self.outboxes:
                outbox.flush()
        self.told += 1
        self.elections[dst].send(step=int(meta.get("event", 0)), micro_batch=self.told, meta=meta,
                                 tensors={k: (v, RAW) for k, v in arrays.items()})

    def state_arrays(self) -> Arrays:
        """The error feedback, and the pseudo-gradient of an event sent and not applied."""
        return {**self.compression.state_arrays("pseudograd"), **{f"own/{k}": v for k, v in self.own.items()}}

    def restore(self, arrays: Mapping[str, np.ndarray], names: list[str], sent: Sequence[str]) -> None:
        """What :meth:`state_arrays` saved; ``sent``: the parameters of the event sent and not applied."""
        self.compression.restore(arrays, names, "pseudograd")
        self.own = {k: np.array(arrays[f"own/{k}"], np.float32) for k in sent}

    def encode(self, outer_round: int, delta: Mapping[str, np.ndarray]) -> EncodedTensors:
        encoded, self.own = self.compression.encode(outer_round, delta)
        return encoded

    def publish(self, event: int, encoded: EncodedTensors, delta: Mapping[str, np.ndarray],
                meta: Mapping[str, Any]) -> dict[str, float]:
        """The event's pseudo-gradient to every other cluster (submitted to the publisher's I/O
        thread); the bytes it sent and their float32 size."""
        for outbox in self.outboxes:
            outbox.send(step=event, micro_batch=event, encoded=encoded, meta=meta)
        wire = sum(enc.nbytes for _, enc in encoded.values())
        raw = sum(d.nbytes for d in delta.values())
        return {"sent_bytes": float(wire * len(self.outboxes)), "raw_bytes": float(raw * len(self.outboxes))}

    def publish_choice(self, event: int, chosen: Members) -> None:
        for outbox in self.choices:
            outbox.send(step=event, micro_batch=event, meta={MEMBERS: bits(chosen)})

    def average(self, event: int, chosen: Members, parts: tuple[Received, ...], like: Mapping[str, np.ndarray],
                mine: str) -> Arrays:
        """The mean of the members' pseudo-gradients of the event (``parts``: the peers' in
        cluster order, and maybe the coordinator's choice), each checked and decoded; its own
        is spent."""
        parts = tuple(p for p in parts if p.envelope.producer != PRODUCER)
        check_start(self.worker.worker_id, event, parts, mine)
        received = iter(self.compression.decode(p.tensors, like) for p in parts)
        deltas: Sequence[Arrays] = [self.own if d == self.index else next(received) for d in chosen]
        self.own = {}
        return average(deltas)
