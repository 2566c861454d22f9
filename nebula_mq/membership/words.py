"""Lives and words: what a cluster's rank 0 tells its other ranks, and what they take from it.

With ``[replicas] ranks`` a cluster runs several ranks and only rank 0 takes part in the
membership (``quorum``): a cluster catching up applies the events it was left out of without
training them, and when it trains again depends on timing. So rank 0 sends its other ranks a
**word** on every event it did not train before the group's checkpoint: ``train`` (sent before
it trains it) or ``skip`` (sent as it applies it untrained); they do as told, and apply an
event only then. Asked to stop while it waits on the WAN, rank 0 leaves without its group and
says so (``left``): a rank idle meanwhile may then leave alone too.

A **life** is one run of the cluster's group: a number the ranks agree on when they start
(:func:`agree_life`). Every word names its life, so a word queued before the group restarted
is old news (:class:`Told` drops it).
"""

from __future__ import annotations

import secrets

from nebula_mq.runtime.agreement import Collective
from nebula_mq.runtime.channel import Received
from nebula_mq.runtime.ordered import OrderedInbox

LEFT = "left"  # the meta key of rank 0's word that it left without its group (a stop while it waited)
WORD = "word"  # the meta key of rank 0's word on an event, with a quorum: TRAIN or SKIP
LIFE = "life"  # ... and of the life it was said in
TRAIN, SKIP = "train", "skip"
NO_LIFE = 1 << 62  # what a rank other than 0 gives to the agreement on rank 0's life (a MIN)


def agree_life(group: Collective, rank: int) -> int:
    """The life of the group just joined: rank 0 draws it, every rank learns it."""
    return group.min_int(secrets.randbelow(NO_LIFE) if rank == 0 else NO_LIFE)


class Told:
    """A rank other than 0: what its rank 0 said in the present life. ``needs_word``: with a
    quorum, it trains and applies an event only on rank 0's word."""

    def __init__(self, needs_word: bool) -> None:
        self.needs_word = needs_word
        self.life = -1  # agreed when the group starts (agree_life)
        self.leader_left = False  # its rank 0 left alone, and so may it
        self.events: dict[int, str] = {}  # rank 0's word on each event, this life

    def handle_other(self, inbox: OrderedInbox, received: Received) -> bool:
        """Rank 0's words, taken only from the present life: that it left (this rank leaves
        alone too once asked to stop, whether that comes before the word or after), whether to
        train an event. Anything else is an event's message, for the ordered inbox."""
        if WORD in received.meta:
            inbox.settle_unordered(received)
            if received.meta.get(LIFE) == self.life and received.meta[WORD] in (TRAIN, SKIP):
                self.events[received.micro_batch] = received.meta[WORD]
            return True
        if not received.meta.get(LEFT):
            return False
        inbox.settle_unordered(received)
        self.leader_left = self.leader_left or received.meta.get(LIFE) == self.life
        return True

    def told_to(self, event: int) -> str:
        """Rank 0's word on ``event`` this life ("" before it comes); earlier events' are spent."""
        for old in [e for e in self.events if e < event]:
            del self.events[old]
        return self.events.get(event, "")

    def may_train(self, event: int) -> bool:
        """Whether to train ``event`` now."""
        return not self.needs_word or self.told_to(event) == TRAIN

    def may_apply(self, event: int, trained: bool) -> bool:
        """Whether to apply ``event``, its average come (``trained``: it trained the event,
        this life or before its checkpoint)."""
        return not self.needs_word or trained or self.told_to(event) == SKIP
