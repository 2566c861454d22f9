"""Discard repeated deliveries by message identity, with bounded memory.

Repeats come from broker redelivery (marked ``redelivered``), from publish
retries after a lost confirm, and from federation link resets (NOT marked), so
the only reliable test is the message's identity. The runtime records an id in
the same checkpoint that holds the message's effect, and acks only after that
checkpoint is durable; a repeat that arrives later is recognised and acked
without being applied again.

Two memories, both exportable to a plain dict for the checkpoint:

* per *stream* (the caller's key, e.g. ``"<flow>/<producer>"``) a sequence
  number watermark: every seq <= ``watermark`` was applied, plus the set of
  applied seqs above it (out-of-order arrivals). Exact while that set stays
  under ``max_pending``; past it the watermark jumps to the lowest pending seq
  and a warning is logged (then a very late first delivery of a skipped seq
  would be taken for a repeat, so size ``max_pending`` well above prefetch);
* a bounded most-recently-recorded set of ids, for messages without a seq.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import structlog

from nebula_mq.errors import CheckpointError

log = structlog.get_logger(__name__)

_STATE_VERSION = 1


class _Stream:
    __slots__ = ("watermark", "pending")

    def __init__(self, watermark: int, pending: set[int]) -> None:
        self.watermark = watermark  # every seq <= watermark was applied
        self.pending = pending  # applied seqs > watermark + 1 (a gap below them)

    def seen(self, seq: int) -> bool:
        return seq <= self.watermark or seq in self.pending

    def record(self, seq: int, max_pending: int, name: str) -> None:
        if self.seen(seq):
            return
        self.pending.add(seq)
        self._advance()
        if len(self.pending) > max_pending:
            lowest = min(self.pending)
            log.warning("dedup gap given up", stream=name, skipped=(self.watermark + 1, lowest - 1))
            self.watermark = lowest - 1
            self._advance()

    def _advance(self) -> None:
        while self.watermark + 1 in self.pending:
            self.watermark += 1
            self.pending.discard(self.watermark)


class Deduplicator:
    """Remembers applied message ids; see the module docstring."""

    def __init__(self, recent_capacity: int = 4096, max_pending: int = 4096, first_seq: int = 0):
        if recent_capacity < 1 or max_pending < 1:
            raise ValueError("recent_capacity and max_pending must be >= 1")
        self.recent_capacity = recent_capacity
        self.max_pending = max_pending
        # Sequence numbers of every stream start here.
        self.first_seq = first_seq
        self._streams: dict[str, _Stream] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()

    def seen(self, message_id: str, stream: str | None = None, seq: int | None = None) -> bool:
        """True when this message's effect was already recorded (discard it, ack it)."""
        if message_id in self._recent:
            return True
        if stream is not None and seq is not None:
            known = self._streams.get(stream)
            return known is not None and known.seen(seq)
        return False

    def record(self, message_id: str, stream: str | None = None, seq: int | None = None) -> None:
        """Note that the message's effect is applied (call before checkpointing)."""
        self._recent[message_id] = None
        self._recent.move_to_end(message_id)
        while len(self._recent) > self.recent_capacity:
            self._recent.popitem(last=False)
        if stream is not None and seq is not None:
            if seq < self.first_seq:
                raise ValueError(f"seq {seq} below first_seq {self.first_seq}")
            known = self._streams.setdefault(stream, _Stream(self.first_seq - 1, set()))
            known.record(seq, self.max_pending, stream)

    def export_state(self) -> dict[str, Any]:
        """Plain, msgpack/JSON-friendly state for a checkpoint."""
        return {
            "version": _STATE_VERSION,
            "recent_capacity": self.recent_capacity,
            "max_pending": self.max_pending,
            "first_seq": self.first_seq,
            "streams": {
                name: {"watermark": s.watermark, "pending": sorted(s.pending)}
                for name, s in self._streams.items()
            },
            "recent": list(self._recent),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Deduplicator:
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise CheckpointError(f"not a version {_STATE_VERSION} deduplicator state")
        try:
            out = cls(int(state["recent_capacity"]), int(state["max_pending"]), int(state["first_seq"]))
            for name, s in state["streams"].items():
                out._streams[str(name)] = _Stream(int(s["watermark"]), {int(x) for x in s["pending"]})
            for message_id in state["recent"]:
                out._recent[str(message_id)] = None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise CheckpointError(f"corrupt deduplicator state: {exc!r}") from None
        return out
