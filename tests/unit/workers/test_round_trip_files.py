"""The README's round trip tells the present: the files it names as deciding something on one
micro-batch's way from the head to the tail and back are the ones that run, and every other
file of ours that runs in a steady-state step is a helper named here (issue 26: a new engineer
reads the README's list, not a profile)."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from nebula_mq.runtime.driver import Driver
from nebula_mq.transport.memory import MemoryBroker
from tests.fixtures.pairs import run_split_pair, split_settings

ROOT = Path(__file__).resolve().parents[3]
# Only the real broker's path runs these; the in-memory transport stands in for them here.
BROKER_ONLY = {"nebula_mq/transport/publisher.py", "nebula_mq/transport/consumer.py",
               "nebula_mq/transport/connection.py"}
# Files that run on the path without deciding where a micro-batch goes or what it becomes.
HELPERS = {
    # a codec's parts below the flow's one encode/decode call
    "nebula_mq/codecs/base.py", "nebula_mq/codecs/cast.py", "nebula_mq/codecs/checks.py",
    "nebula_mq/codecs/decoding.py", "nebula_mq/codecs/int8.py", "nebula_mq/codecs/lossless.py",
    "nebula_mq/codecs/quantise.py", "nebula_mq/codecs/schedule.py", "nebula_mq/wire/tree.py",
    "nebula_mq/wire/limits.py",  # the size check before a send (it refuses; it decides nothing)
    # what a step reports: logs, metrics, progress, status, tensorboard
    "nebula_mq/runtime/hooks.py", "nebula_mq/runtime/logs.py", "nebula_mq/runtime/metrics.py",
    "nebula_mq/runtime/reporter.py", "nebula_mq/runtime/tracking.py", "nebula_mq/runtime/worker.py",
    "nebula_mq/runtime/sampler.py", "nebula_mq/runtime/progress.py", "nebula_mq/atomic.py",
    # the step's bookkeeping: stop flags, agreement, deferred acks, the checkpoint store
    "nebula_mq/runtime/signals.py", "nebula_mq/runtime/agreement.py", "nebula_mq/runtime/checkpoint.py",
    "nebula_mq/runtime/window.py", "nebula_mq/runtime/hold.py",
    "nebula_mq/runtime/role.py",  # the role protocol's defaults (a role's optional hooks)
    # names, keys and settings read on the way
    "nebula_mq/security/auth.py", "nebula_mq/security/keys.py", "nebula_mq/settings.py",
    "nebula_mq/topology.py", "workers/split/job.py", "workers/split/routing.py",
    # the in-memory transport and the publish retry it shares with the publisher
    "nebula_mq/transport/base.py", "nebula_mq/transport/memory.py", "nebula_mq/transport/retry.py",
    "nebula_mq/transport/backoff.py",
}


def readme_round_trip() -> set[str]:
    """The files (or folders) the README names, in its paragraph on one micro-batch's way."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("Following one micro-batch")
    paragraph = text[start:text.index("\n\n", start)]
    named = set(re.findall(r"`((?:nebula_mq|workers)/[\w/]+(?:\.py|/))", paragraph))
    # "`consumer.py` and `connection.py`": a bare name is in the folder of the file before it
    named |= {f"nebula_mq/transport/{name}" for name in re.findall(r"`(\w+\.py)`", paragraph)}
    return named


def files_of_steady_steps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> set[str]:
    """Our files that run in the head's and the tail's steps 5 to 7 of the split example."""
    seen: set[str] = set()
    on = threading.Event()
    finished = {"steps": 0}
    finish_step = Driver.finish_step

    def counting(self: Driver, *args: Any) -> None:
        finish_step(self, *args)
        finished["steps"] += 1  # both sides' steps, interleaved
        if 10 <= finished["steps"] < 16:
            on.set()
        else:
            on.clear()

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call" and on.is_set():
            name = frame.f_code.co_filename
            if name.startswith(str(ROOT)):
                seen.add(Path(name).relative_to(ROOT).as_posix())

    monkeypatch.setattr(Driver, "finish_step", counting)
    threading.setprofile(profile)  # type: ignore[arg-type]
    try:
        run_split_pair(split_settings(tmp_path, steps=20, in_flight=1), MemoryBroker())
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    return {f for f in seen if f.startswith(("nebula_mq/", "workers/"))}


def test_the_readme_names_the_files_that_decide_and_nothing_else_runs(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    named = readme_round_trip()
    ran = files_of_steady_steps(monkeypatch, tmp_path)
    assert len(named) >= 10, named

    def is_named(path: str) -> bool:
        return path in named or any(n.endswith("/") and path.startswith(n) for n in named)

    unnamed = sorted(f for f in ran if not is_named(f) and f not in HELPERS)
    assert not unnamed, f"on the round trip but neither in the README's list nor a helper: {unnamed}"
    missing = sorted(n for n in named - BROKER_ONLY
                     if not any(f == n or (n.endswith("/") and f.startswith(n)) for f in ran))
    assert not missing, f"the README names these but they did not run: {missing}"
