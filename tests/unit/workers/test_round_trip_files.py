"""docs/architecture.md's round trip tells the present: the files it lists are the files one
split-job micro-batch meets, in the order it first meets them, from the head to the tail and
back, and no other file of ours runs on that way (issue 52: a new engineer follows that list,
not a profile).

What counts is taken from a traced run, not from a list kept here: every file of ``nebula_mq/``
and ``workers/`` that the micro-batch's way enters is on the page, except the few in
:data:`OBSERVERS`, a closed set of files that only write down what a step did. So a new file on
the way fails this test until the page lists it where the micro-batch meets it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest

from nebula_mq.runtime.channel import Received
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import run_split_pair, split_settings

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "architecture.md"
SECTION = "## One micro-batch, there and back"
# The micro-batch followed: its gradient completes the head's step 10, which ends in a checkpoint
# (checkpoint_every 5), so the way back covers checkpoint-then-ack too.
MICRO_BATCH = 9
# Files that only write down what a step did (log lines, metrics, status, the run's progress);
# a micro-batch goes the same way and becomes the same with or without them. This set is closed:
# a file that decides or carries anything belongs on the page, not here.
OBSERVERS = frozenset({
    "nebula_mq/runtime/logs.py", "nebula_mq/runtime/hooks.py", "nebula_mq/runtime/metrics.py",
    "nebula_mq/runtime/reporter.py", "nebula_mq/runtime/tracking.py",
})
HEAD, TAIL = "workers/split/head.py", "workers/split/tail.py"
DRIVER, MEMORY = "nebula_mq/runtime/driver.py", "nebula_mq/transport/memory.py"


@dataclass(frozen=True)
class Event:
    """One call into, or return from, a function of ours, in one thread."""

    call: bool
    file: str
    function: str
    depth: int  # how many of our frames are below it on the thread's stack
    micro_batch: int | None  # a call's ``mb`` argument; a return's Received micro-batch


def trace_split_run(tmp_path: Path) -> dict[str, list[Event]]:
    """Every call and return of ours in each worker thread of the split example's head and
    tail (one rank each, one micro-batch in flight, the in-memory transport)."""
    events: dict[str, list[Event]] = {}
    depths: dict[str, int] = {}
    root = f"{ROOT}/"

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event not in ("call", "return") or not frame.f_code.co_filename.startswith(root):
            return
        file = frame.f_code.co_filename[len(root):]
        if not file.startswith(("nebula_mq/", "workers/")):
            return
        thread = threading.current_thread().name
        depth = depths.get(thread, 0)
        if event == "call":
            mb = frame.f_locals.get("mb") if frame.f_code.co_name == "send_activation" else None
            events.setdefault(thread, []).append(Event(True, file, frame.f_code.co_name, depth, mb))
            depths[thread] = depth + 1
        else:
            depths[thread] = depth - 1
            mb = arg.micro_batch if isinstance(arg, Received) else None
            events.setdefault(thread, []).append(Event(False, file, frame.f_code.co_name, depth - 1, mb))

    threading.setprofile(profile)
    try:
        run_split_pair(split_settings(tmp_path, steps=20, in_flight=1), MemoryBroker())
    finally:
        threading.setprofile(None)
    return events


def find(events: list[Event], start: int, call: bool, file: str, function: str,
         micro_batch: int | None = None) -> int:
    """The index of the first such event at or after ``start``."""
    for i in range(start, len(events)):
        e = events[i]
        if (e.call, e.file, e.function) == (call, file, function) and micro_batch in (None, e.micro_batch):
            return i
    raise AssertionError(f"no {'call of' if call else 'return from'} {file} {function} "
                         f"(micro-batch {micro_batch}) after event {start}")


def delivered(events: list[Event], start: int, mb: int) -> int:
    """The index of the first return, at or after ``start``, that hands over micro-batch ``mb``
    as a :class:`Received` (whichever function of ours it is)."""
    for i in range(start, len(events)):
        if not events[i].call and events[i].micro_batch == mb:
            return i
    raise AssertionError(f"no Received of micro-batch {mb} returned after event {start}")


def returned(events: list[Event], call: int) -> int:
    """The index of the return that ends the call at index ``call``."""
    return next(i for i in range(call + 1, len(events))
                if not events[i].call and events[i].depth == events[call].depth)


def called_from(events: list[Event], index: int, caller: str) -> int:
    """The call, among those open at ``index``, that a function of ``caller`` made: the whole
    of what ``caller`` asked for when it led to ``index``."""
    depth, i = events[index].depth, index
    if not events[i].call:  # a return: from the call it ends
        i = next(j for j in range(i - 1, -1, -1) if events[j].call and events[j].depth == depth)
    while True:
        parent = next(j for j in range(i - 1, -1, -1) if events[j].call and events[j].depth == depth - 1)
        if events[parent].file == caller:
            return i
        assert depth > 1, f"{events[index]} was not reached from {caller}"
        depth, i = depth - 1, parent


def first_entries(*parts: list[Event]) -> list[str]:
    """Our files in the order the parts first enter them, the observers left out."""
    order: dict[str, None] = {}
    for part in parts:
        order.update((e.file, None) for e in part if e.call and e.file not in OBSERVERS and e.file not in order)
    return list(order)


def traced_round_trip(events: dict[str, list[Event]], mb: int) -> tuple[list[str], list[str], set[str]]:
    """The files micro-batch ``mb`` meets there (head to tail) and back (gradient to head), each
    leg in order of first entry, and every file of ours the round trip entered.

    There: the head's ``send_activation(mb)``, then the tail from the driver's wait that
    delivered ``mb`` to its loss and gradient. Back: the tail from there until the reply has
    left (the call from ``tail.py`` that put it on the broker), then the head from the driver's
    wait that delivered the reply to the send of the next micro-batch. Each leg is cut out of
    its own thread, so how the two threads interleave changes nothing.
    """
    head, tail = events["worker-head-0"], events["worker-tail-0"]
    sent = find(head, 0, True, HEAD, "send_activation", mb)
    head_there = head[sent:returned(head, sent) + 1]

    arrived = called_from(tail, delivered(tail, 0, mb), DRIVER)
    trained = find(tail, arrived, False, TAIL, "loss_and_grad")
    tail_there = tail[arrived:trained + 1]
    replied = called_from(tail, find(tail, trained, True, MEMORY, "put"), TAIL)
    tail_back = tail[trained + 1:returned(tail, replied) + 1]

    answered = called_from(head, delivered(head, sent, mb), DRIVER)
    head_back = head[answered:find(head, answered, True, HEAD, "send_activation", mb + 1)]

    legs = (head_there, tail_there, tail_back, head_back)
    return (first_entries(head_there, tail_there), first_entries(tail_back, head_back),
            {e.file for leg in legs for e in leg})


def listed() -> tuple[list[str], list[str], set[str]]:
    """The page's two numbered lists (there, back) and every file its section names."""
    text = PAGE.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end >= 0 else len(text)]

    def numbered(title: str) -> list[str]:
        block = section[section.index(title):]
        block = block[:block.find("\n\n", block.index("\n1. "))]
        return re.findall(r"^\d+\. `([\w/.]+)`", block, flags=re.M)

    named = set(re.findall(r"`((?:nebula_mq|workers|examples)/[\w/.]+\.py)`", section))
    return numbered("**There**"), numbered("**Back**"), named


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str], set[str]]:
    return traced_round_trip(trace_split_run(tmp_path_factory.mktemp("split")), MICRO_BATCH)


def test_every_file_the_page_names_exists() -> None:
    there, back, named = listed()
    assert len(there) >= 10 and len(back) >= 10, (there, back)
    missing = sorted(f for f in named | set(there) | set(back) if not (ROOT / f).is_file())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_the_page_lists_the_files_one_micro_batch_meets_in_the_order_it_meets_them(
        round_trip: tuple[list[str], list[str], set[str]]) -> None:
    there, back, _ = round_trip
    page_there, page_back, _ = listed()
    wrong = [f"the way {leg} in docs/architecture.md is not the traced one; traced, in order of first "
             "entry:\n" + "\n".join(f"{i}. {f}" for i, f in enumerate(traced, 1))
             for leg, page, traced in (("there (head -> tail)", page_there, there),
                                       ("back (gradient -> head)", page_back, back)) if page != traced]
    assert not wrong, "\n\n".join(wrong)


def test_the_observers_left_off_the_page_exist_and_run_on_the_way(
        round_trip: tuple[list[str], list[str], set[str]]) -> None:
    _, _, entered = round_trip
    assert OBSERVERS <= entered, f"left off the page but not on the way: {sorted(OBSERVERS - entered)}"
