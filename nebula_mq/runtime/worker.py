"""The part of every worker daemon that is not about its role: what a role is given.

A worker owns: its transport to the local broker, a checkpoint store, hooks
(metrics, logs), a status file, and the list of deliveries whose effect is
applied in memory but not yet checkpointed. :meth:`Worker.commit` writes the
checkpoint and only then acks those deliveries: the queue-level replay
contract (see ``nebula_mq.transport.consumer``).

Nobody subclasses it: the loop is the driver's (``runtime.driver``), which runs a
role (a plain object) with a worker inside :meth:`Worker.lifecycle`.

SIGTERM and SIGINT set a stop flag; the driver checks it between micro-batches,
finishes what is in flight, commits, and exits 0. A restart resumes from the last
checkpoint: safe at any moment, since anything not in a checkpoint is still unacked
on the broker.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

import numpy as np

from nebula_mq.errors import ConfigError
from nebula_mq.runtime.agreement import Agreement
from nebula_mq.runtime.checkpoint import Checkpoint, CheckpointStore
from nebula_mq.runtime.hooks import Hook, Hooks
from nebula_mq.runtime.logs import bind_context, get_logger
from nebula_mq.runtime.metrics import MetricsHook
from nebula_mq.runtime.sampler import QueueSampler
from nebula_mq.runtime.signals import StopFlag, install_stop_handlers
from nebula_mq.runtime.tracking import tensorboard_hook
from nebula_mq.settings import Settings
from nebula_mq.transport.base import Delivery, Transport
from nebula_mq.wire.auth import EnvelopeAuth
from nebula_mq.atomic import write_json_atomic

if TYPE_CHECKING:
    from nebula_mq.runtime.channel import Outbox

log = get_logger(__name__)

# How often a worker logs a progress line (step, rate, ETA, values), in seconds.
PROGRESS_LOG_S = 30.0


def make_transport(settings: Settings, cluster: str) -> Transport:
    """The RabbitMQ transport to ``cluster``'s broker, from the job's settings."""
    if cluster not in settings.clusters:
        raise ConfigError(settings.source or "<settings>", f"clusters.{cluster}",
                          f"a cluster named in {sorted(settings.clusters)}", cluster)
    from nebula_mq.transport.rabbit import RabbitTransport

    broker = settings.clusters[cluster].broker
    return RabbitTransport(broker, settings.transport, settings.job.id, cluster)


def status_dir(settings: Settings) -> Path:
    return settings.run_dir / "status"


@final
class Worker:
    """One worker process's identity, transport, checkpoints, acks and reports; the roles
    in the top-level ``workers`` package are given one (``workers.base.role_worker``)."""

    def __init__(
        self,
        settings: Settings,
        cluster: str,
        worker_id: str,
        transport: Transport | None = None,
        hooks: Sequence[Hook] = (),
        checkpoint_every: int = 10,
        *,
        auth: EnvelopeAuth,
        role: str = "worker",
    ) -> None:
        """``auth`` signs, verifies and seals this worker's envelopes (the roles build it
        from the job's key: ``nebula_mq.security.auth.load_message_auth``); ``role`` names
        the role in status, metrics and logs."""
        self.role = role
        self.settings = settings
        self.cluster = cluster
        # Unique within the job; names the checkpoint dir, status and metrics files.
        self.worker_id = worker_id
        self.checkpoint_every = max(1, checkpoint_every)
        run_dir = settings.run_dir
        self.store = CheckpointStore(run_dir / "checkpoints" / worker_id)
        # Always a textfile (read by `nebula-mq status`); also served over HTTP at /metrics
        # when [job] metrics_port is set (`nebula-mq worker --metrics-port`).
        port = settings.job.metrics_port
        self.metrics = MetricsHook(self.role, run_dir / "metrics" / f"{worker_id}.prom", port=port or None,
                                   identity={"job": settings.job.id, "worker": worker_id, "cluster": cluster})
        tracking = tensorboard_hook(run_dir / "tensorboard" / worker_id) if settings.job.tensorboard else None
        self.hooks = Hooks([self.metrics, *([tracking] if tracking else []), *hooks])
        self.transport = transport if transport is not None else make_transport(settings, cluster)
        self.auth = auth
        self.stop_requested = StopFlag()  # set by signal handlers, polled by the loop
        # Start, stop and ack agreed with the worker's group; alone until a role joins one.
        self.agreement = Agreement(self.stop_requested)
        self._pending_acks: list[Delivery] = []
        self.open_outboxes: list[Outbox] = []  # each registers itself; commit flushes them
        # Queues this worker reads (its inboxes register them), sampled into the metrics.
        self.watched_queues: set[str] = set()
        self._dead_letter_alarm = False
        # Samples them (and the dead-letter queue) on its own thread while `main` runs.
        self.sampler = QueueSampler(
            self.transport.queue_probe(), lambda: frozenset(self.watched_queues),
            self.transport.dead_letter_queue, self.hooks, run_dir / "queues" / f"{worker_id}.jsonl",
            self.check_dead_letters, name=f"queue-sampler-{worker_id}")
        self._progress_logged: tuple[float, int] | None = None  # (time, step) of the last line
        self.step = 0
        self.values: dict[str, float] = {}
        self.history: list[dict[str, float]] = []
        bind_context(job=settings.job.id, role=self.role, worker=worker_id, cluster=cluster)

    # ------------------------------------------------------------------ lifecycle

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: finish the micro-batch in flight, checkpoint, ack, exit.
        A second SIGINT (a second Ctrl-C) exits at once (see ``runtime.signals``)."""
        install_stop_handlers(self.stop_requested)

    def lifecycle(self, body: Callable[[], int]) -> int:
        """Run ``body`` (a driver's loop) to completion or to a stop request with the transport
        open, its queues sampled on the sampler's thread (``runtime.sampler``) meanwhile."""
        self.write_status("starting")
        with self.transport:
            self.sampler.start()
            try:
                code = body()
                self.sampler.stop(final=True)  # after one last sample: the queues as the worker leaves them
                if self.stop_requested.is_set():
                    log.info("stop_requested", signals=self.stop_requested.signal_names(), step=self.step)
            except BaseException:
                self.write_status("failed")
                raise
            finally:
                self.sampler.stop()  # (a failed run) bounded, like the final stop above; then a no-op
                self.hooks.close()
        self.write_status("finished" if code == 0 and not self.stop_requested.is_set()
                          else "stopped")
        return code

    # ------------------------------------------------------------------ replay contract

    def defer_ack(self, delivery: Delivery) -> None:
        """Ack ``delivery`` once the next checkpoint (holding its effect) is durable."""
        self._pending_acks.append(delivery)

    def commit(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> Checkpoint:
        """Checkpoint at ``self.step``, then ack everything it covers. First the broker must hold
        every message sent so far: a checkpoint never claims a send the broker could still lose."""
        for outbox in list(self.open_outboxes):
            outbox.flush()
        ck = self.store.save(self.step, arrays, meta)
        # A rank of a group acks only once every rank holds this checkpoint: no rank acks a
        # message that a restart of the group from its lowest common checkpoint needs again.
        self.agreement.before_ack()
        for delivery in self._pending_acks:
            delivery.ack()  # False when the connection died: the repeat is deduped later
        self._pending_acks.clear()
        log.info("checkpoint", step=self.step, digest=ck.digest[:16])
        return ck

    def has_checkpoint_at_step(self) -> bool:
        steps = self.store.steps()
        return bool(steps) and steps[-1] == self.step

    def record_step(self, values: Mapping[str, float]) -> None:
        self.values = {k: float(v) for k, v in values.items()}
        self.history.append({"step": float(self.step), "time": time.time(), **self.values})
        self.sampler.tick()  # samples here only for a worker driven without `main`
        self.log_progress()
        self.hooks.on_step(self.step, self.values)
        self.write_status("running")

    def log_progress(self) -> None:
        """One ``progress`` log line every :data:`PROGRESS_LOG_S` seconds: the step, steps/s
        since the last line, the ETA to the job's last step, and the step's values."""
        now = time.monotonic()
        if self._progress_logged is None:
            self._progress_logged = (now, self.step)
            return
        t0, step0 = self._progress_logged
        if now - t0 < PROGRESS_LOG_S:
            return
        self._progress_logged = (now, self.step)
        rate = (self.step - step0) / (now - t0)
        total = self.settings.job.steps
        eta = round((total - self.step) / rate) if rate > 0 and self.step < total else None
        log.info("progress", step=self.step, total=total, steps_per_s=round(rate, 3), eta_s=eta,
                 **{k: round(v, 5) for k, v in self.values.items()})

    def check_dead_letters(self, depth: int) -> None:
        """Raise the alarm when the dead-letter queue passes ``[transport] dead_letter_alarm``
        (once per crossing), and lower it when someone has drained it. The sampler calls it with
        each sample's depth of the dead-letter queue."""
        bound = self.settings.transport.dead_letter_alarm
        alarm = depth > bound
        if alarm and not self._dead_letter_alarm:
            log.error("dead_letter_alarm", queue=self.transport.dead_letter_queue, messages=depth, bound=bound,
                      hint="inspect them (each is in the audit log as message_dead_lettered) and drain the queue")
        self._dead_letter_alarm = alarm
        self.metrics.of(self.metrics.dead_letter_alarm).set(1.0 if alarm else 0.0)

    def write_status(self, state: str, **extra: Any) -> None:
        path = status_dir(self.settings) / f"{self.worker_id}.json"
        body = {
            "worker": self.worker_id, "role": self.role, "cluster": self.cluster,
            "job": self.settings.job.id, "pid": os.getpid(), "state": state,
            "step": self.step, "updated": time.time(), "values": self.values, **extra,
        }
        write_json_atomic(path, body, sort_keys=True)

    def write_history(self) -> Path:
        """Per-step values (loss curves) for reports, as JSON lines."""
        path = self.settings.run_dir / "history" / f"{self.worker_id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            for row in self.history:
                fh.write(json.dumps(row, sort_keys=True) + "\n")
        self.history.clear()
        return path
