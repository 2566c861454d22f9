"""A worker's queue sampler: the depth of the queues it reads, taken on a thread of its own.

When the worker's state changes (:meth:`QueueSampler.nudge`: starting, resuming, its first
step), and every :data:`QUEUE_SAMPLE_S` seconds after, the sampler thread reads from the local broker the ready messages of each queue
the worker reads and of the job's dead-letter queue, and their size in bytes where the broker
has a management API. It reads through the transport's queue probe (``Transport.queue_probe``;
for RabbitMQ: one long-lived connection of the sampler thread's own for the passive declares,
and one HTTPS request per queue). Each sample

* sets the queue gauges (``Hook.on_queue_depth``, called on the sampler thread);
* appends a JSON line per queue to ``<run_dir>/queues/<worker>.jsonl``, for the report's
  backpressure plot (the gauges only hold the latest);
* raises or lowers the dead-letter alarm (``Reporter.dead_letters``);
* publishes the worker's status with those depths to the job's status exchange, which
  federation carries to every cluster (``nebula-mq status --feed``).

The training thread never waits for the broker on the sampler's account. A sample that fails,
whatever the cause, logs ``queue_sample_failed`` and is skipped; sampling goes on.

Lifecycle (``Worker.main``): :meth:`QueueSampler.start` once the transport is open;
``stop(final=True)`` as the worker leaves: the thread takes one last sample (a queue younger
than the broker's statistics interval has no size yet, and the final sample gives even a short
job one that has), closes the probe and ends; ``stop`` waits for that at most
:data:`STOP_WAIT_S` seconds. A sampler whose thread never started (a worker stepped outside
``lifecycle``) samples nothing: its stop only closes the probe.
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from nebula_mq.errors import NebulaError
from nebula_mq.runtime.hooks import Hook
from nebula_mq.runtime.logs import get_logger
from nebula_mq.transport.probe import QueueProbe

log = get_logger(__name__)

# How often a worker samples the depth of the queues it reads (seconds).
QUEUE_SAMPLE_S = 10.0
# How long stopping waits for the sampler thread and its final sample (seconds). A thread
# still busy then (a broker that does not answer) is left to end on its own: it is a daemon.
STOP_WAIT_S = 10.0


class QueueSampler:
    """Samples one worker's queues; see the module docstring."""

    def __init__(
        self,
        probe: QueueProbe,
        queues: Callable[[], Iterable[str]],
        dead_letter_queue: str,
        hooks: Hook,
        rows: Path,
        on_dead_letters: Callable[[int], None],
        name: str = "queue-sampler",
        status: Callable[[], dict[str, Any]] | None = None,
        status_exchange: str = "",
    ) -> None:
        """``queues``: the queues the worker reads now (called from the sampler thread, so it
        must return a copy); ``rows``: the JSON-lines file; ``on_dead_letters``: called with the
        dead-letter queue's depth at each sample; ``name``: the thread's name; ``status``: the
        worker's latest status (a copy), published with the sample's depths to
        ``status_exchange``."""
        self.probe = probe
        self._queues = queues
        self.dead_letter_queue = dead_letter_queue
        self._hooks = hooks
        self.rows = rows
        self._on_dead_letters = on_dead_letters
        self.name = name
        self._status, self.status_exchange = status, status_exchange
        self.thread: threading.Thread | None = None
        self._wake = threading.Event()  # set by start, a nudge and stop
        self._stopping = False  # stop was called; the thread leaves its loop
        self._final = False  # stop asked for a last sample
        self._stopped = False

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self) -> None:
        """Sample on a daemon thread, at once and then every
        :data:`QUEUE_SAMPLE_S` seconds, until :meth:`stop`. Once per sampler."""
        if self.thread is not None or self._stopped:
            return
        context = contextvars.copy_context()  # the worker's log fields (job, role, worker)
        self.thread = threading.Thread(target=context.run, args=(self._run,), name=self.name, daemon=True)
        self._wake.set()  # the first sample at once: the feed hears a worker that is starting
        self.thread.start()

    def nudge(self) -> None:
        """Sample (and publish the worker's status) now rather than at the next interval: the
        worker's state changed (starting, resuming, running at its first step), and the feed
        should say so. The caller never waits for the broker."""
        if self.thread is not None and not self._stopped:
            self._wake.set()

    def stop(self, final: bool = False, timeout: float | None = None) -> bool:
        """Stop sampling, after one last sample when ``final`` (by a started thread), and close
        the probe (on the thread that used it). Waits for the thread at most ``timeout`` seconds (default
        :data:`STOP_WAIT_S`); returns whether it has ended. Only the first call does anything."""
        if self._stopped:
            return not self.running
        self._stopped = True
        if self.thread is None:
            self._close_probe()
            return True
        self._final = final
        self._stopping = True  # before the wake-up: the thread reads it once awake
        self._wake.set()
        wait = STOP_WAIT_S if timeout is None else timeout
        self.thread.join(wait)
        if self.thread.is_alive():
            log.warning("queue_sampler_stuck", waited_s=wait, final=final,
                        hint="the broker did not answer; the sampler thread ends on its own")
            return False
        return True

    def sample(self) -> bool:
        """Take one sample now, on the calling thread, and publish the worker's status with
        it. Returns False when either failed: that is logged (``queue_sample_failed``,
        ``status_publish_failed``), never raised. The status goes out even when the queue
        depths could not be read (a rank host that cannot reach the management API): the job's
        view hears the worker, without its queues."""
        rows, sampled = self._sample_queues()
        try:
            self._publish_status(rows if sampled else [])  # some queues' depths would mislead a sum
        except NebulaError as exc:  # a broker hiccup costs a status message, never a step
            log.warning("status_publish_failed", error=str(exc))
            return False
        except Exception as exc:  # noqa: BLE001 - nor does anything else
            log.warning("status_publish_failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
            return False
        return sampled

    def _sample_queues(self) -> tuple[list[dict[str, Any]], bool]:
        """The depth of every watched queue, appended to the rows file: (rows, True); or, when
        a read failed, (the rows read before it, not written, False)."""
        queue: str | None = None
        rows: list[dict[str, Any]] = []
        try:
            for queue in sorted({*self._queues(), self.dead_letter_queue}):
                depth = self.probe.queue_depth(queue)
                if depth is None:  # no such queue (yet)
                    continue
                size = self.probe.queue_bytes(queue)
                self._hooks.on_queue_depth(queue, depth, size)
                row = {"time": time.time(), "queue": queue, "messages": depth}
                rows.append(row if size is None else {**row, "bytes": size})
                if queue == self.dead_letter_queue:
                    self._on_dead_letters(depth)
            queue = None
            self.rows.parent.mkdir(parents=True, exist_ok=True)
            with self.rows.open("a") as fh:
                fh.writelines(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        except NebulaError as exc:  # a broker hiccup costs a sample, never a step
            log.warning("queue_sample_failed", queue=queue, error=str(exc))
            return rows, False
        except Exception as exc:  # noqa: BLE001 - nor does anything else (a full disk, a bug)
            log.warning("queue_sample_failed", queue=queue, error=f"{type(exc).__name__}: {exc}", exc_info=True)
            return rows, False
        return rows, True

    def _publish_status(self, rows: list[dict[str, Any]]) -> None:
        if self._status is None or not self.status_exchange:
            return
        status = self._status()
        if not status:  # nothing reported yet: the next sample has something to say
            return
        queues = {r["queue"]: {k: v for k, v in r.items() if k in ("messages", "bytes")} for r in rows}
        body = json.dumps({**status, "queues": queues, "sent": time.time()}, sort_keys=True).encode()
        self.probe.publish_status(self.status_exchange, str(status.get("worker", "")), body)

    def _run(self) -> None:
        try:
            self._wake.wait()  # set by start
            while not self._stopping:
                self.sample()
                self._wake.clear()
                if not self._stopping:  # (stop may have come during the sample)
                    self._wake.wait(QUEUE_SAMPLE_S)
            if self._final:
                self.sample()
        finally:
            self._close_probe()

    def _close_probe(self) -> None:
        try:
            self.probe.close()
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.warning("queue_probe_close_failed", error=f"{type(exc).__name__}: {exc}")
