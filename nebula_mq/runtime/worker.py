"""What a role is given: one worker process's identity, transport, ledger, reporter and sampler.

A worker is composed of:

* its transport to the local broker (``nebula_mq.transport``);
* its :class:`~nebula_mq.runtime.ledger.Ledger`: the checkpoints, and the deliveries
  whose effect is applied in memory but not yet checkpointed. :meth:`Worker.commit`
  writes the checkpoint and only then acks those deliveries: the queue-level replay
  contract;
* its :class:`~nebula_mq.runtime.reporter.Reporter`: status file, progress, history,
  metrics, tensorboard, the dead-letter alarm;
* its :class:`~nebula_mq.runtime.sampler.QueueSampler`, on its own thread and connection;
* its group :class:`~nebula_mq.runtime.agreement.Agreement` and its stop flag.

Nobody subclasses it: the loop is the driver's (``runtime.driver``), which runs a role (a
plain object) with a worker inside :meth:`Worker.lifecycle`. SIGTERM and SIGINT set the stop
flag; the driver checks it between micro-batches, finishes what is in flight, commits, and
exits 0. A restart resumes from the last checkpoint: safe at any moment, since anything not
in a checkpoint is still unacked on the broker.

While the local broker blocks publishing (a memory or disk alarm: ``transport.alarm``) the
publishers wait as long as it lasts, and the status says ``broker_alarm``. A stop requested
then cannot wait for the confirms a checkpoint needs: the publishers' waits end with
``StopDuringAlarm``, and the worker stops (exit 0) without a last checkpoint.

A full disk (``ENOSPC``, ``EDQUOT``, ``EROFS``) stops the worker at its next checkpoint with
one ``CheckpointError`` (``CheckpointStore.save``): the last good checkpoint is intact and
nothing after it was acked, so the same command resumes once there is space. What a worker
writes besides (status file, history rows, metrics, tensorboard) is skipped meanwhile, with
one ``write_skipped`` warning each (``atomic.SkipWhenFull``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import numpy as np

from nebula_mq import topology
from nebula_mq.atomic import SkipWhenFull, disk_full
from nebula_mq.errors import ConfigError, StopDuringAlarm, one_line
from nebula_mq.runtime.agreement import Agreement, Collective
from nebula_mq.runtime.checkpoint import Checkpoint, CheckpointStore
from nebula_mq.runtime.hooks import Hook, Hooks
from nebula_mq.runtime.ledger import Ledger
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.reporter import Reporter
from nebula_mq.runtime.sampler import QueueSampler
from nebula_mq.runtime.signals import StopFlag, install_stop_handlers
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Transport
from nebula_mq.wire.auth import EnvelopeAuth

log = get_logger(__name__)


def write_skipped(what: str, problem: str) -> None:
    """One warning for a report skipped on a full disk (until it is written again)."""
    log.warning("write_skipped", what=what, error=problem,
                hint="the disk is full: the worker goes on, and stops at its next checkpoint if it stays full")


def make_transport(settings: Settings, cluster: str) -> Transport:
    """The RabbitMQ transport to ``cluster``'s broker, from the job's settings."""
    if cluster not in settings.clusters:
        raise ConfigError(settings.source or "<settings>", f"clusters.{cluster}",
                          f"a cluster named in {sorted(settings.clusters)}", cluster)
    from nebula_mq.transport.rabbit import RabbitTransport

    broker = settings.clusters[cluster].broker
    return RabbitTransport(broker, settings.transport, settings.job.id, cluster)


@final
class Worker:
    """One worker process: identity, transport, ledger, reporter, sampler, agreement, step. A
    role's entry point builds one (``workers.base.WorkerIdentity``) and gives it to the role and
    to the driver (``runtime.driver.drive``); the role reads it and never assigns into it."""

    def __init__(
        self,
        settings: Settings,
        cluster: str,
        worker_id: str,
        transport: Transport,
        hooks: Sequence[Hook] = (),
        checkpoint_every: int = 10,
        *,
        auth: EnvelopeAuth,
        role: str = "worker",
    ) -> None:
        """``transport``: to ``cluster``'s broker (:func:`make_transport`, or an in-memory one in
        tests); ``auth`` signs, verifies and seals this worker's envelopes (the entry points
        build it from the job's key: ``nebula_mq.security.auth.load_message_auth``); ``role``
        names the role in status, metrics and logs."""
        self.role = role
        self.settings = settings
        self.cluster = cluster
        # Unique within the job; names the checkpoint dir, status and metrics files.
        self.worker_id = worker_id
        self.checkpoint_every = max(1, checkpoint_every)
        run_dir = settings.run_dir
        self.ledger = Ledger(CheckpointStore(run_dir / "checkpoints" / worker_id))
        self.report = Reporter(settings, cluster, worker_id, role)
        # The status file and the history rows are reports, not the source of truth: a full disk skips them.
        self.status_file, self.history_file = SkipWhenFull("status", write_skipped), SkipWhenFull("history", write_skipped)
        self.hooks = Hooks([*self.report.hooks(), *hooks])
        self.transport = transport
        self.auth = auth
        self.stop_requested = StopFlag()  # set by signal handlers, polled by the loop
        # Start, stop and ack agreed with the worker's group; alone until a role joins one.
        self.agreement = Agreement(self.stop_requested)
        # Queues this worker reads (its inboxes register them), sampled into the metrics.
        self.watched_queues: set[str] = set()
        dead_letter_queue = self.transport.dead_letter_queue
        # Samples them (and the dead-letter queue) on its own thread while `lifecycle` runs.
        self.sampler = QueueSampler(
            self.transport.queue_probe(), lambda: frozenset(self.watched_queues), dead_letter_queue,
            self.hooks, run_dir / "queues" / f"{worker_id}.jsonl",
            lambda depth: self.report.dead_letters(dead_letter_queue, depth), name=f"queue-sampler-{worker_id}",
            status=lambda: dict(self.report.last), status_exchange=topology.status_exchange(settings.job.id))
        self.report.on_state_change = lambda _state: self.sampler.nudge()
        # A broker alarm shows in the status; a stop requested during one ends the publishers' waits.
        self.transport.alarm.subscribe(
            lambda reason: self.status_file(lambda: self.report.broker_alarm(self.transport.alarm.where, reason)))
        self.transport.alarm.stop_when(self.stop_requested.is_set)
        self.step = 0
        bind_context(job=settings.job.id, role=self.role, worker=worker_id, cluster=cluster)

    @property
    def store(self) -> CheckpointStore:
        return self.ledger.store

    def join(self, group: Collective, leaves_alone: Callable[[], bool] | None = None) -> None:
        """Start, stop and ack from here on agreed with ``group``, the role's group, joined in
        its ``open`` (``runtime.agreement``, where ``leaves_alone`` is told)."""
        self.agreement = Agreement(self.stop_requested, group, leaves_alone)

    def resume_at(self, step: int) -> None:
        """Go on from ``step``: a role restored from another job's checkpoint (a hot start)
        counts its steps from what that checkpoint trained, not from its step."""
        self.step = step

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: finish the micro-batch in flight, checkpoint, ack, exit.
        A second SIGINT (a second Ctrl-C) exits at once (see ``runtime.signals``)."""
        install_stop_handlers(self.stop_requested)

    def lifecycle(self, body: Callable[[], int]) -> int:
        """Run ``body`` (a driver's loop) to completion or to a stop request with the transport
        open, its queues sampled on the sampler's thread (``runtime.sampler``) meanwhile."""
        self.status("starting")
        with self.transport:
            self.sampler.start()
            try:
                try:
                    code = body()
                except StopDuringAlarm as exc:  # no last checkpoint: the unconfirmed sends go again on restart
                    log.warning("stopped_during_broker_alarm", error=str(exc), step=self.step)
                    code = 0
                self.status("finished" if code == 0 and not self.stop_requested.is_set() else "stopped")
                # One last sample: the queues as the worker leaves them, and its last status to the feed.
                self.sampler.stop(final=True)
                if self.stop_requested.is_set():
                    log.info("stop_requested", signals=self.stop_requested.signal_names(), step=self.step)
            except BaseException as exc:
                # Skipped on a full disk: the error raised is what counts.
                self.status("failed", reason=one_line(exc))
                self.sampler.stop(final=True, timeout=2.0)  # tell the feed, if the broker still answers
                raise
            finally:
                self.sampler.stop()  # bounded, like the stops above; then a no-op
                self.hooks.close()
        return code

    def status(self, state: str, **extra: Any) -> None:
        """Write the status file (``Reporter.status``); skipped on a full disk."""
        self.status_file(lambda: self.report.status(state, **extra))

    def waiting(self, text: str | None) -> None:
        """The worker waits for its peers (``text``: whom, since when) or no longer (None): its
        status says so, in the state it had (``Reporter.waiting``)."""
        self.status_file(lambda: self.report.waiting(text))

    def write_history(self) -> None:
        """Append the history rows since the last call (``Reporter.write_history``). On a full
        disk the file is cut back to its length before (a torn row would swallow the next one
        appended) and the rows are kept for the next call."""
        path = self.settings.run_dir / "history" / f"{self.worker_id}.jsonl"
        before = path.stat().st_size if path.exists() else 0

        def write() -> None:
            try:
                self.report.write_history()
            except OSError as exc:
                if disk_full(exc) and path.exists():
                    with contextlib.suppress(OSError):
                        os.truncate(path, before)
                raise
        self.history_file(write)

    def commit(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Checkpoint:
        """Checkpoint at ``self.step`` and ack what it covers (``Ledger.commit``), agreed with the group.
        A failed checkpoint (a full disk) raises ``CheckpointError`` before anything is acked."""
        ck = self.ledger.commit(self.step, arrays, meta, self.agreement.before_ack)
        self.report.checkpoint = self.step
        log.info("checkpoint", step=self.step, digest=ck.digest[:16])
        return ck

    def record_step(self, values: Mapping[str, float]) -> None:
        """``self.step`` is done with ``values``: reported, and the hooks told."""
        # Its status write may be skipped; the first step's ("running") wakes the sampler: the feed hears it.
        self.status_file(lambda: self.report.record(self.step, values))
        self.hooks.on_step(self.step, self.report.values)
