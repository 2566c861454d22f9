"""Training scalars as TensorBoard event files, one run per worker (``<run_dir>/tensorboard/<worker>``).

``tensorboard --logdir run/jobs/demo/tensorboard`` then shows every worker's loss, learning
rate, accuracy and the other values it records, as ML users are used to.

Why tensorboardX: it writes the event files TensorBoard reads without TensorFlow or torch,
it is maintained (2.6.x), and it needs only numpy, protobuf and packaging, which paddle
already brings. VisualDL, Paddle's own viewer, would add Flask, pandas and matplotlib to
every worker and has had no release since 2023; a home-made event writer would be a
substitute for a real component.

The event file is a report, not the source of truth: on a full disk its writes (on the
writer's thread and at close) are skipped, with one ``write_skipped`` warning until one
succeeds again, and the training goes on (``atomic.SkipWhenFull``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nebula_mq.atomic import SkipWhenFull
from nebula_mq.runtime.hooks import Hook
from nebula_mq.runtime.logs import get_logger

log = get_logger(__name__)

# Seconds between flushes of the event file (tensorboardX's default is 120).
FLUSH_S = 10


class TensorBoardHook(Hook):
    """Each step's values as scalars tagged by name, at the step. The writer (and its thread)
    starts at the first step, so a worker that never trains leaves nothing behind."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.make_writer = _summary_writer_class()
        self.writer: Any = None
        # Creating the writer (the training thread) and writing its file (the writer's thread).
        self.create, self.file_write = SkipWhenFull("tensorboard", _skipped), SkipWhenFull("tensorboard", _skipped)

    def on_step(self, step: int, values: Mapping[str, float]) -> None:
        if self.writer is None:
            self.writer = self.create(self._open)
            if self.writer is None:  # a full disk: the next step tries again
                return
        for name, value in values.items():
            if math.isfinite(value):
                self.writer.add_scalar(name, value, step)

    def _open(self) -> Any:
        writer = self.make_writer(str(self.logdir), flush_secs=FLUSH_S)
        # The record writer's file operations skip on a full disk: raised on tensorboardX's
        # thread, the error would end that thread, and then the next events would fill its
        # queue and block the training thread.
        records = getattr(getattr(getattr(getattr(writer, "file_writer", None), "event_writer", None),
                                  "_ev_writer", None), "_py_recordio_writer", None)
        for name in ("write", "flush", "close") if records is not None else ():
            method = getattr(records, name)
            setattr(records, name, lambda *args, _method=method: self.file_write(lambda: _method(*args)))
        return writer

    def close(self) -> None:
        if self.writer is None:
            return
        # tensorboardX closes its event queue without joining the queue's feeder thread, which
        # then lingers for a moment after the worker is done: join it, so closing is complete.
        file_writer = getattr(self.writer, "file_writer", None)
        queue = getattr(getattr(file_writer, "event_writer", None), "_event_queue", None)
        self.writer.close()
        if queue is not None:
            queue.join_thread()
        self.writer = None


def _summary_writer_class() -> Any:
    """tensorboardX's ``SummaryWriter``, imported without torch unless torch is loaded already.

    tensorboardX's writer imports torch where it is installed, only to accept torch tensors,
    and this hook gives it floats. That import cost every Paddle worker about 2 s of CPU at each
    start and restart, more than Paddle's own import costs. A ``None`` in ``sys.modules`` makes
    ``import torch`` raise the ImportError that tensorboardX expects where torch is missing; it
    is taken out again at once, so the worker's own model can still import torch."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


def _skipped(what: str, problem: str) -> None:
    log.warning("write_skipped", what=what, error=problem, hint="the disk is full: the training goes on without it")


def tensorboard_hook(logdir: Path) -> TensorBoardHook | None:
    """The hook, or None (logged once) where tensorboardX is not installed (the ``train`` extra has it)."""
    try:
        return TensorBoardHook(logdir)
    except ImportError:
        log.warning("tensorboard_unavailable", hint="pip install tensorboardX (the [train] extra has it)")
        return None
