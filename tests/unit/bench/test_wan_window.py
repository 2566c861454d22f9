"""``bench wan``'s notes: a window too small for the link (in_flight steps must span the round
trip plus a step, or the head waits for gradients: what the H200 run showed at 100 ms), and a
link too slow for a step's bytes, where no window helps."""

from __future__ import annotations

from nebula_mq.bench.wan_notes import link_note, window_note


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


def test_a_link_too_slow_for_a_steps_bytes_is_named_instead_of_the_window() -> None:
    # The H200's language-identification split job: fp16 activations, 196,608 bytes a step, at
    # 60 Mbit/s take 26 ms against a 14 ms step inside one cluster; the bench measured 0.55x.
    row = {"row": "60mbit-20ms", "delay_ms": 20.0, "rate_mbit": 60.0, "busiest_bytes_per_step": 196_608.0,
           "ratio": 0.55}
    note = link_note(0.014, row)
    assert note is not None
    assert "60mbit-20ms: the link is full" in note and "26 ms at 60 Mbit/s" in note and "at most 0.53x" in note
    assert window_note(12, 0.014, row) is not None  # what the bench printed before: a deeper window


def test_no_link_note_where_the_link_carries_a_step_in_less_than_a_step() -> None:
    # int8 activations: 13 ms of wire a step at 60 Mbit/s against the 14 ms step.
    row = {"row": "60mbit-20ms", "rate_mbit": 60.0, "busiest_bytes_per_step": 98_304.0}
    assert link_note(0.014, row) is None
    assert link_note(0.014, {"row": "in-cluster", "rate_mbit": None, "busiest_bytes_per_step": 98_304.0}) is None
    assert link_note(0.014, {"row": "60mbit-20ms", "rate_mbit": 60.0}) is None
