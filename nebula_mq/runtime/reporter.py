"""What a worker tells the people running it: its status file, progress lines, step history,
metrics (textfile and HTTP), tensorboard scalars, the dead-letter alarm and its client
certificate's end (``runtime.cert_expiry``).

Nothing here touches the broker: the queue depths reach the metrics from the sampler's own
thread (``runtime.sampler``), and every write here is a local file, atomic where another
process reads it (``nebula-mq status``, ``nebula-mq report``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, final

from nebula_mq.atomic import write_json_atomic
from nebula_mq.runtime.cert_expiry import CertificateExpiry
from nebula_mq.runtime.hooks import Hook
from nebula_mq.runtime.logs import get_logger
from nebula_mq.runtime.metrics import MetricsHook
from nebula_mq.runtime.tracking import tensorboard_hook
from nebula_mq.settings import Settings

log = get_logger(__name__)

# How often a worker logs a progress line (step, rate, ETA, values), in seconds.
PROGRESS_LOG_S = 30.0
# Steps the reported step rate is measured over.
RATE_WINDOW = 20


def status_dir(settings: Settings) -> Path:
    return settings.run_dir / "status"


def record_stop(settings: Settings, worker_id: str, reason: str, **identity: str) -> None:
    """``worker_id`` stopped with ``reason`` before its reporter existed (a model, device or
    data function refused at start-up): its status file says ``failed`` and why, keeping what
    an earlier run of it wrote (step, checkpoint). A status already ``failed`` is kept: the
    worker wrote it itself, closer to the failure."""
    path = status_dir(settings) / f"{worker_id}.json"
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        body = {}
    if body.get("state") == "failed":
        return
    body.update(worker=worker_id, job=settings.job.id, pid=os.getpid(), host=socket.gethostname(), **identity,
                state="failed", reason=reason, updated=time.time())
    body.setdefault("step", 0)
    body.setdefault("total", settings.job.steps)
    write_json_atomic(path, body, sort_keys=True)


@final
class Reporter:
    """One worker's reports: ``status`` and the step's values go to files and metrics."""

    def __init__(self, settings: Settings, cluster: str, worker_id: str, role: str) -> None:
        self.settings, self.cluster, self.worker_id, self.role = settings, cluster, worker_id, role
        run_dir = settings.run_dir
        # Always a textfile (read by `nebula-mq status`); also served over HTTP at /metrics
        # when [job] metrics_port is set (`nebula-mq worker --metrics-port`).
        port = settings.job.metrics_port
        self.metrics = MetricsHook(role, run_dir / "metrics" / f"{worker_id}.prom", port=port or None,
                                   identity={"job": settings.job.id, "worker": worker_id, "cluster": cluster})
        self.tracking = tensorboard_hook(run_dir / "tensorboard" / worker_id) if settings.job.tensorboard else None
        self.step = 0
        self.values: dict[str, float] = {}
        self.history: list[dict[str, float]] = []  # rows since the last write_history
        self._progress_logged: tuple[float, int] | None = None  # (time, step) of the last line
        self._dead_letter_alarm = False
        self.checkpoint: int | None = None  # the step of the last checkpoint this process wrote
        self._recent: deque[tuple[float, int]] = deque(maxlen=RATE_WINDOW)  # (time, step) of recent steps
        self.last: dict[str, Any] = {}  # the status last written: what the status feed publishes
        # Told each new state (starting, resuming, running, failed...): the worker's sampler
        # publishes it to the feed at once, not at its next sample.
        self.on_state_change: Callable[[str], None] = lambda _state: None
        # The cluster whose broker blocks our publishers now (a memory or disk alarm), and why.
        self.alarm: tuple[str, str] | None = None
        self._status_call: tuple[str, dict[str, Any]] | None = None  # the last status(state, extra)
        self._status_lock = threading.Lock()  # the training thread and a publisher's I/O thread write it
        # The end of the client certificate this worker logs in with (TLS only).
        cluster_settings = settings.clusters.get(cluster)
        broker = cluster_settings.broker if cluster_settings is not None else None
        self.certificate = (CertificateExpiry(broker.cert_file, settings.security.cert_warn_days)
                            if broker is not None and broker.tls and broker.cert_file else None)

    def hooks(self) -> list[Hook]:
        """The hooks that report what the worker's messages and steps do."""
        return [self.metrics, *([self.tracking] if self.tracking else [])]

    def record(self, step: int, values: Mapping[str, float]) -> None:
        """Step ``step`` is done with ``values``: history row, progress line, status."""
        self.step = step
        self.values = {k: float(v) for k, v in values.items()}
        now = time.time()
        self.history.append({"step": float(step), "time": now, **self.values})
        self._recent.append((now, step))
        self.log_progress()
        self.status("running")

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

    def steps_per_s(self) -> float | None:
        """The step rate over the last :data:`RATE_WINDOW` steps (None before two steps)."""
        if len(self._recent) < 2:
            return None
        (t0, s0), (t1, s1) = self._recent[0], self._recent[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None

    def status(self, state: str, **extra: Any) -> None:
        """The status file ``nebula-mq status`` reads: state, step, values, and ``extra``; the
        same body is what the sampler publishes to the job's status feed. While the local broker
        blocks our publishers it also says so: ``broker_alarm`` (the cluster) and
        ``broker_alarm_reason`` (``low on memory``, ``low on disk``). With TLS it carries the
        client certificate's end (``cert_expires_in_days``, ``cert_not_after``, and near it
        ``cert_warning``: ``runtime.cert_expiry``)."""
        path = status_dir(self.settings) / f"{self.worker_id}.json"
        with self._status_lock:
            self._status_call = (state, extra)
            alarm = {} if self.alarm is None else {"broker_alarm": self.alarm[0], "broker_alarm_reason": self.alarm[1]}
            cert = self._certificate()
            body = {
                "worker": self.worker_id, "role": self.role, "cluster": self.cluster,
                "job": self.settings.job.id, "pid": os.getpid(), "host": socket.gethostname(), "state": state,
                "step": self.step, "total": self.settings.job.steps, "updated": time.time(), "values": self.values,
                "steps_per_s": self.steps_per_s(), "checkpoint": self.checkpoint, **alarm, **cert, **extra,
            }
            write_json_atomic(path, body, sort_keys=True)
            changed = self.last.get("state") != state
            self.last = body  # one assignment: the sampler thread reads whole bodies only
        if changed:
            self.on_state_change(state)

    def _certificate(self) -> dict[str, Any]:
        """The certificate's status fields, its gauge set to the same ``notAfter``."""
        fields = self.certificate.fields() if self.certificate is not None else {}
        if fields and self.certificate is not None and self.certificate.not_after is not None:
            self.metrics.of(self.metrics.certificate_expiry).set(self.certificate.not_after.timestamp())
        return fields

    def waiting(self, text: str | None) -> None:
        """The status, in the state it had, says whom the worker waits for (``waiting_for``),
        or no longer (None); the next step's status clears it too."""
        with self._status_lock:
            state, extra = self._status_call or ("starting", {})
        extra = {k: v for k, v in extra.items() if k != "waiting_for"}
        self.status(state, **extra, **({"waiting_for": text} if text else {}))

    def broker_alarm(self, cluster: str, reason: str | None) -> None:
        """``cluster``'s broker blocks our publishers for ``reason`` now, or no longer (None): the
        status says so at once, in the state it had (``transport.alarm.BrokerAlarm`` calls it, from
        a publisher's I/O thread)."""
        with self._status_lock:
            self.alarm = None if reason is None else (cluster, reason)
            call = self._status_call
        if call is not None:
            self.status(call[0], **call[1])

    def write_history(self) -> Path:
        """The rows since the last call (loss curves, for reports), appended as JSON lines."""
        path = self.settings.run_dir / "history" / f"{self.worker_id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            for row in self.history:
                fh.write(json.dumps(row, sort_keys=True) + "\n")
        self.history.clear()
        return path

    def dead_letters(self, queue: str, depth: int) -> None:
        """Raise the alarm when ``queue`` (the dead-letter queue) passes ``[transport]
        dead_letter_alarm`` messages, once per crossing, and lower it once someone drained it.
        The sampler calls it with each sample's depth."""
        bound = self.settings.transport.dead_letter_alarm
        alarm = depth > bound
        if alarm and not self._dead_letter_alarm:
            log.error("dead_letter_alarm", queue=queue, messages=depth, bound=bound,
                      hint="inspect them (each is in the audit log as message_dead_lettered) and drain the queue")
        self._dead_letter_alarm = alarm
        self.metrics.of(self.metrics.dead_letter_alarm).set(1.0 if alarm else 0.0)
