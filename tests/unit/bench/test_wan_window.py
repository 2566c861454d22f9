"""``bench wan``'s notes: a window too small for the link (in_flight - 1 steps must span the loop
from the tail's gradient to the head's next activation: both delays, both directions' wire and the
head's turn; what the H200 run showed at 100 ms), and a link too slow for a step's bytes, where
no window helps."""

from __future__ import annotations

from nebula_mq.bench.wan_report import link_note, window_note


def test_a_window_short_of_the_round_trip_is_named_with_the_in_flight_that_covers_it() -> None:
    row = {"row": "60mbit-100ms", "delay_ms": 100.0}
    note = window_note(4, 0.033, row)
    assert note is not None
    assert "60mbit-100ms" in note and "leaves 99 ms (3 steps of 33 ms) for a 200 ms loop" in note
    assert "in_flight >= 8" in note  # 7 steps of 33 ms span 200 ms


def test_the_loop_holds_both_directions_wire_and_the_heads_turn() -> None:
    # The demo at 10 Mbit/s +100 ms (2026-11-29): a 186 ms step, the encoder computing 77% of it;
    # 94 kB of activations and 47 kB of gradients a step. Traced: 146 ms from the decoder's
    # gradient to the encoder, 141 ms of encoder turn.
    row = {"row": "10mbit-100ms", "delay_ms": 100.0, "rate_mbit": 10.0,
           "bytes_per_step_by_side": [94_000.0, 47_000.0], "ratio": 0.92}
    head_turn = 0.77 * 0.186
    assert window_note(3, 0.186, row, head_turn) == (
        "note: 10mbit-100ms: in_flight 3 leaves 372 ms (2 steps of 186 ms) for a 456 ms loop (200 ms of "
        "delay, 113 ms of wire, the head's 143 ms turn): the pipeline waits on the link; in_flight >= 4 would hide it")
    # Without the wire and the turn, 2 steps would have seemed to span the 200 ms of delay.
    assert window_note(3, 0.186, {**row, "bytes_per_step_by_side": [], "ratio": 1.0}) is None
    # 4 in flight span the loop on paper; the row's 0.92x is still named, with a deeper window.
    note = window_note(4, 0.186, row, head_turn)
    assert note is not None and "0.92x the samples/s, the bound 1.00x as busy, with in_flight 4" in note
    assert "in_flight 8" in note
    # Samples/s at par on a host that ran faster, the tail 0.93x as busy: named all the same.
    note = window_note(4, 0.186, {**row, "ratio": 1.03, "busy_ratio": 0.93}, head_turn)
    assert note is not None and "1.03x the samples/s, the bound 0.93x as busy" in note


def test_no_note_where_the_window_covers_the_link_or_there_is_no_delay() -> None:
    assert window_note(12, 0.033, {"row": "60mbit-100ms", "delay_ms": 100.0}) is None
    assert window_note(4, 0.033, {"row": "60mbit-0ms", "delay_ms": 0.0}) is None
    assert window_note(None, 0.033, {"row": "60mbit-100ms", "delay_ms": 100.0}) is None


def test_a_row_below_095_with_a_window_that_seems_enough_is_still_named() -> None:
    # What the demo showed at 10 Mbit/s +20 ms: 4 x 144 ms spans the 184 ms estimate, yet 0.77x.
    note = window_note(4, 0.144, {"row": "10mbit-20ms", "delay_ms": 20.0, "ratio": 0.77})
    assert note is not None and "0.77x the samples/s, the bound 1.00x as busy, with in_flight 4" in note and "in_flight 8" in note
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
