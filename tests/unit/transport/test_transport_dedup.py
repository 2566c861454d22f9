"""The deduplicator: exact while gaps stay small, bounded, and checkpointable."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_mq.errors import CheckpointError
from nebula_mq.transport import Deduplicator

# Deliveries: (stream, seq), with repeats and arbitrary order.
deliveries = st.lists(st.tuples(st.sampled_from(["gen/w0", "gen/w1"]), st.integers(0, 60)), max_size=200)


@given(deliveries, st.integers(0, 200))
@settings(max_examples=200, deadline=None)
def test_seen_is_exactly_what_was_recorded(events: list[tuple[str, int]], cut: int) -> None:
    dedup = Deduplicator(recent_capacity=8, max_pending=1000)
    recorded: set[tuple[str, int]] = set()
    for i, (stream, seq) in enumerate(events):
        if i == cut:  # a checkpoint and restart in the middle changes nothing
            dedup = Deduplicator.from_state(json.loads(json.dumps(dedup.export_state())))
        message_id = f"job/{stream}/{seq}"
        assert dedup.seen(message_id, stream, seq) == ((stream, seq) in recorded)
        dedup.record(message_id, stream, seq)
        recorded.add((stream, seq))


@given(st.permutations(list(range(300))))
@settings(max_examples=50, deadline=None)
def test_memory_stays_bounded_when_gaps_close(order: list[int]) -> None:
    dedup = Deduplicator(recent_capacity=16, max_pending=1000)
    for seq in order:
        dedup.record(f"m{seq}", "s", seq)
    state = dedup.export_state()
    assert state["streams"]["s"] == {"watermark": 299, "pending": []}
    assert len(state["recent"]) == 16


def test_ids_without_seq_use_the_bounded_recent_set() -> None:
    dedup = Deduplicator(recent_capacity=3)
    for i in range(5):
        dedup.record(f"r{i}")
    assert [dedup.seen(f"r{i}") for i in range(5)] == [False, False, True, True, True]


def test_too_many_pending_gives_up_the_oldest_gap() -> None:
    dedup = Deduplicator(max_pending=4)
    for seq in (2, 3, 4, 5, 6):  # seq 0 and 1 never arrive
        dedup.record(f"m{seq}", "s", seq)
    assert dedup.export_state()["streams"]["s"]["watermark"] == 6
    assert dedup.seen("m0", "s", 0)  # the documented price of the bound


def test_corrupt_state_is_a_checkpoint_error() -> None:
    with pytest.raises(CheckpointError):
        Deduplicator.from_state({"version": 99})
    with pytest.raises(CheckpointError):
        Deduplicator.from_state({"version": 1, "recent_capacity": 1, "max_pending": 1,
                                 "first_seq": 0, "streams": {"s": {"watermark": "x"}},
                                 "recent": []})
