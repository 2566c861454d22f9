from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nebula_mq.errors import OutOfWindow, ReplayedMessage
from nebula_mq.runtime.ordered import InOrderBuffer


@given(st.permutations(list(range(20))), st.lists(st.integers(0, 19), max_size=30))
def test_any_arrival_order_with_duplicates_releases_each_once_in_order(
    order: list[int], dups: list[int]
) -> None:
    buf: InOrderBuffer[str] = InOrderBuffer(window=32)
    released: list[int] = []
    arrivals = order + dups
    for idx in arrivals:
        if buf.is_duplicate(idx):
            with pytest.raises(ReplayedMessage) if idx < buf.next_index else _noop():
                buf.push(idx, f"x{idx}")
        else:
            buf.push(idx, f"x{idx}")
        for ready in buf.pop_ready():
            assert ready.item == f"x{ready.index}"
            released.append(ready.index)
    assert released == list(range(20))
    assert len(buf) == 0


class _noop:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def test_window_bounds_memory() -> None:
    buf: InOrderBuffer[int] = InOrderBuffer(next_index=10, window=4)
    buf.push(13, 13)
    with pytest.raises(OutOfWindow):
        buf.push(14, 14)
    with pytest.raises(ReplayedMessage):
        buf.push(9, 9)
    assert list(buf.pop_ready()) == []
    buf.push(10, 10)
    assert [r.index for r in buf.pop_ready()] == [10]
    assert buf.next_index == 11
