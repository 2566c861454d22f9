"""A cluster's replica on several ranks: data parallelism inside the cluster, DiLoCo across.

With ``[replicas] ranks = R``, cluster ``c`` runs R processes, one gloo group (NCCL on GPUs).
Every inner step rank ``r`` takes piece ``r`` of R equal pieces of the cluster's batch (cut
along the first axis), computes its gradients, and all-reduces their mean with the other
ranks, so every rank steps its inner optimizer on the same gradient and all hold the same
weights: R ranks train what one process trains on the whole batch, up to the float rounding
of the mean. The step's stop votes and the loss ride in the same collective
(``runtime.agreement``), so the ranks stop at the same event and checkpoint together.

Rank 0 alone talks across the WAN: it sends the pseudo-gradient and gathers the other
clusters'. After every event it publishes the event's average, float32, to each of its
cluster's other ranks on ``outer-<c>-r<r>`` (the cluster's own broker: nothing more crosses
the WAN), and each of them takes the same outer step from it, so every rank of every cluster
holds the same outer weights. That flow is the other ranks' one ordered stream: exactly once,
acked with the checkpoints the group writes together.

With a quorum (``nebula_mq.membership.quorum``) rank 0 alone knows whether its cluster trains an
event: a cluster catching up applies the events it was left out of without training them, and
when it trains again depends on timing. So rank 0 tells the other ranks, on the same flow, for
every event it did not train before the group's checkpoint: ``train`` (sent before it trains
it) or ``skip`` (sent as it applies it untrained); they do as told, and apply an event only
then. The average carries the event's members, so a rank left out goes back to its state before
it trained, as rank 0 does. A word names rank 0's life (a number the group agrees on when it
starts): a word from an earlier life, still queued after the group restarted, is old news. An
average from an earlier life is not (the coordinator's log fixes each event's members, so an
event's average has the same bytes in every life), but it says nothing of whether to train.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from nebula_mq.errors import WorkerError
from nebula_mq.membership.quorum import MEMBERS, Members, bits, members_of
from nebula_mq.models.frameworks import Framework, Group
from nebula_mq.runtime.agreement import Agreement
from nebula_mq.runtime.channel import Outbox, Received
from nebula_mq.runtime.ordered import OrderedInbox
from nebula_mq.runtime.worker import Worker
from workers.replicas.exchange import RAW, check_start
from workers.replicas.job import ReplicasJob, rank_flow, replica_id
from workers.split.shards import piece

LEFT = "left"  # the meta key of rank 0's word that it left without its group (a stop while it waited)
WORD = "word"  # the meta key of rank 0's word on an event, with a quorum: TRAIN or SKIP
LIFE = "life"  # ... and of the life it was said in
TRAIN, SKIP = "train", "skip"
NO_LIFE = 1 << 62  # what a rank other than 0 gives to the agreement on rank 0's life (a MIN)

Arrays = dict[str, np.ndarray]


class ClusterRanks:
    """Rank ``rank`` of cluster ``c``'s replica among its cluster's ranks (see the module docstring)."""

    def __init__(self, job: ReplicasJob, c: int, rank: int, fw: Framework) -> None:
        if not 0 <= rank < job.ranks:
            raise WorkerError(f"rank {rank} outside 0..{job.ranks - 1} ([replicas] ranks)")
        self.job, self.cluster, self.rank, self.world, self.fw = job, c, rank, job.ranks, fw
        self.group: Group | None = None
        self.outboxes: list[Outbox] = []
        self.leader_left = False  # a rank other than 0: its rank 0 left alone, and so may it
        self.told = job.goes_on_without and self.world > 1  # the ranks train an event on rank 0's word
        self.life = -1  # rank 0's, agreed when the group starts: its words name it
        self.words: list[Outbox] = []  # rank 0's train words to the other ranks
        self.told_events: dict[int, str] = {}  # a rank other than 0: rank 0's word on each event, this life
        if self.world > 1:  # a rank started on a host that is not its own: one line, before it connects
            job.group_address(c).bind_env(rank)

    @property
    def source(self) -> str:
        """The producer a rank other than 0 reads: its cluster's rank 0."""
        return replica_id(self.cluster)

    def open(self, worker: Worker) -> None:
        """Join the cluster's group (its agreement becomes the worker's), and on rank 0 open the
        outboxes to the other ranks."""
        if self.world == 1:
            return
        self.group = self.fw.join_group(self.rank, self.job.group_address(self.cluster), self.job.group_timeout_s)
        # A rank other than 0 idles while rank 0 waits on the WAN: asked to stop, it leaves alone
        # only once rank 0 has (or rank 0, given the WAN's message, would enter a collective alone).
        worker.join(self.group, None if self.rank == 0 else (lambda: self.leader_left))
        self.life = self.group.min_int(secrets.randbelow(NO_LIFE) if self.rank == 0 else NO_LIFE)
        if self.rank == 0:
            self.outboxes = [Outbox(worker, rank_flow(self.job, self.cluster, r), worker.worker_id)
                             for r in range(1, self.world)]
            if self.told:
                self.words = [Outbox(worker, rank_flow(self.job, self.cluster, r), f"{worker.worker_id}-{WORD}")
                              for r in range(1, self.world)]

    def close(self, worker: Worker) -> None:
        """Close the outboxes; rank 0 leaving without its group tells the other ranks first."""
        if self.outboxes and worker.stop_requested.is_set() and not worker.agreement.agreed_stop:
            for r in range(1, self.world):
                word = Outbox(worker, rank_flow(self.job, self.cluster, r), f"{worker.worker_id}-{LEFT}")
                word.send(step=worker.step, micro_batch=worker.step, meta={LEFT: 1, LIFE: self.life})
                word.flush()
                word.close()
        for outbox in self.outboxes + self.words:
            outbox.close()

    def tell(self, event: int, word: str) -> None:
        """Rank 0, with a quorum: the cluster trains ``event`` (TRAIN, before rank 0 trains it)
        or applies it untrained (SKIP)."""
        for outbox in self.words:
            outbox.send(step=event, micro_batch=event, meta={WORD: word, LIFE: self.life})

    def told_to(self, event: int) -> str:
        """A rank other than 0: rank 0's word on ``event`` this life ("" before it comes)."""
        for old in [e for e in self.told_events if e < event]:
            del self.told_events[old]
        return self.told_events.get(event, "")

    def may_train(self, event: int) -> bool:
        """A rank other than 0: whether to train ``event`` now (always without a quorum)."""
        return not self.told or self.told_to(event) == TRAIN

    def may_apply(self, event: int, trained: bool) -> bool:
        """A rank other than 0 whose rank 0's average of ``event`` has come: whether to apply it
        now (``trained``: it trained the event, this life or before its checkpoint)."""
        return not self.told or trained or self.told_to(event) == SKIP

    def handle_other(self, worker: Worker, inbox: OrderedInbox, received: Received) -> bool:
        """A rank other than 0: rank 0's words, taken only from its present life (a word queued
        before the group restarted is old news): that it left (this rank leaves alone too once
        asked to stop, whether that comes before the word or after), whether to train an event."""
        if WORD in received.meta:
            inbox.settle_unordered(received)
            if received.meta.get(LIFE) == self.life and received.meta[WORD] in (TRAIN, SKIP):
                self.told_events[received.micro_batch] = received.meta[WORD]
            return True
        if not received.meta.get(LEFT):
            return False
        inbox.settle_unordered(received)
        self.leader_left = self.leader_left or received.meta.get(LIFE) == self.life
        return True

    def piece(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """This rank's piece of a batch's arrays (all of them with one rank)."""
        out = [np.asarray(a) for a in arrays]
        if self.world == 1:
            return out
        pieces = []
        for a in out:
            if a.shape[0] % self.world:
                raise WorkerError(f"a batch of {a.shape[0]} rows cannot be cut into [replicas] ranks = "
                                  f"{self.world} equal pieces: make the batch a multiple of the ranks")
            pieces.append(a[piece(a.shape[0], self.world, self.rank)])
        return pieces

    def reduce(self, model: Any, loss: float, agreement: Agreement) -> float:
        """The gradients' mean over the cluster's ranks, on every rank; the stop votes and the
        loss ride along. Returns the mean loss over the ranks."""
        if self.group is None:
            return loss
        (summed,) = agreement.voted(partial(self.group.allreduce_gradients, self.fw.trainable(model), "mean"), loss)
        return float(summed) / self.world

    def share(self, event: int, mean: Mapping[str, np.ndarray], members: Members, meta: Mapping[str, Any]) -> None:
        """Rank 0: the event's average and members to every other rank of the cluster."""
        for outbox in self.outboxes:
            outbox.send(step=event, micro_batch=event, tensors={k: (np.asarray(v), RAW) for k, v in mean.items()},
                        meta={**meta, MEMBERS: bits(members)})

    def admit(self, received: Received) -> None:
        """A rank other than 0: the average's members are checked as it arrives (malformed: a
        dead letter, not a stopped rank)."""
        self.members(received)

    def members(self, received: Received) -> Members:
        """The members an average names; every cluster when it names none (an average queued by
        a version before quorums with ranks, which had no quorum)."""
        if MEMBERS not in received.meta:
            return tuple(range(self.job.n))
        return members_of(received.meta, self.job.n, self.job.quorum or self.job.n, first=not self.job.elected)

    def received(self, worker_id: str, event: int, parts: tuple[Received, ...], mine: str) -> tuple[Arrays, Members]:
        """A rank other than 0: the event's average its rank 0 sent, from the same outer weights,
        and the event's members."""
        check_start(worker_id, event, parts, mine)
        (part,) = parts
        return {k: np.asarray(v, np.float32) for k, v in part.tensors.items()}, self.members(part)
