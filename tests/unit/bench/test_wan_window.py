"""``bench wan``'s note on a window too small for the link: in_flight steps must span the round
trip plus a step, or the head waits for gradients (what the H200 run showed at 100 ms)."""

from __future__ import annotations

from nebula_mq.bench.wan_ratio import window_note


def test_a_window_short_of_the_round_trip_is_named_with_the_in_flight_that_covers_it() -> None:
    row = {"row": "60mbit-100ms", "delay_ms": 100.0}
    note = window_note(4, 0.033, row)
    assert note is not None
    assert "60mbit-100ms" in note and "covers 132 ms of the 233 ms" in note and "in_flight >= 8" in note


def test_no_note_where_the_window_covers_the_link_or_there_is_no_delay() -> None:
    assert window_note(12, 0.033, {"row": "60mbit-100ms", "delay_ms": 100.0}) is None
    assert window_note(4, 0.033, {"row": "60mbit-0ms", "delay_ms": 0.0}) is None
    assert window_note(None, 0.033, {"row": "60mbit-100ms", "delay_ms": 100.0}) is None


def test_a_row_below_095_with_a_window_that_seems_enough_is_still_named() -> None:
    # What the demo showed at 10 Mbit/s +20 ms: 4 x 144 ms spans the 184 ms estimate, yet 0.77x.
    note = window_note(4, 0.144, {"row": "10mbit-20ms", "delay_ms": 20.0, "ratio": 0.77})
    assert note is not None and "0.77x with in_flight 4" in note and "in_flight 8" in note
    assert window_note(4, 0.144, {"row": "10mbit-20ms", "delay_ms": 20.0, "ratio": 0.96}) is None
