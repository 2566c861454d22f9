"""Prometheus metrics of one worker, as a hook.

Each worker has its own registry. It is served over HTTP when a port is given
(``/metrics``) and always written to ``<run_dir>/metrics/<worker>.prom`` after
each step, so ``nebula-mq status`` can read a worker's figures without a port.

Every series carries the worker's identity (``job``, ``worker``, ``role``,
``cluster``), so one Prometheus scraping every worker of every job can tell
them apart without relabelling.

On a full disk the textfile is not written (one ``write_skipped`` warning until it is
written again; ``write_to_textfile`` removes its temporary file): the figures stay in the
registry, served over HTTP, and the next step's write brings the file up to date.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server, write_to_textfile
from prometheus_client.metrics import MetricWrapperBase

from nebula_mq.atomic import SkipWhenFull
from nebula_mq.errors import WorkerError
from nebula_mq.runtime.hooks import Hook, MessageEvent
from nebula_mq.runtime.logs import get_logger

log = get_logger(__name__)


IDENTITY = ("job", "worker", "role", "cluster")
M = TypeVar("M", bound=MetricWrapperBase)


class MetricsHook(Hook):
    def __init__(self, role: str, textfile: str | os.PathLike[str] | None = None,
                 port: int | None = None, identity: Mapping[str, str] | None = None) -> None:
        """``identity``: the job, worker and cluster labels (the role is ``role``)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.textfile = Path(textfile) if textfile else None
        self.textfile_write = SkipWhenFull("metrics", _skipped)
        given = dict(identity or {})
        self.identity = tuple(given.get(k, role if k == "role" else "") for k in IDENTITY)

        def counter(name: str, text: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, text, [*IDENTITY, *labels], registry=r)

        def gauge(name: str, text: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, text, [*IDENTITY, *labels], registry=r)

        self.steps = counter("nebula_steps", "Optimisation steps done")
        self.step = gauge("nebula_step", "Current step")
        self.raw_bytes = counter("nebula_raw_bytes", "Tensor bytes before compression", ("flow", "direction"))
        self.wire_bytes = counter("nebula_wire_bytes", "Envelope bytes on the wire", ("flow", "direction"))
        self.messages = counter("nebula_messages", "Messages", ("flow", "direction"))
        self.redeliveries = counter("nebula_redeliveries", "Deliveries flagged redelivered", ("flow",))
        self.duplicates = counter("nebula_duplicates", "Deliveries discarded as duplicates", ("flow",))
        self.dead_letters = counter("nebula_dead_letters", "Messages dead-lettered", ("flow", "reason"))
        self.compute_s = counter("nebula_compute_seconds", "Time spent computing")
        self.wait_s = counter("nebula_wait_seconds", "Time spent waiting on the queues")
        # Sampled from the local broker every few seconds on the sampler's thread (runtime.sampler).
        self.queue_messages = gauge("nebula_queue_messages", "Ready messages in a queue this worker reads",
                                    ("queue",))
        # From the broker's management API, when the worker's broker settings name one.
        self.queue_bytes = gauge("nebula_queue_bytes", "Bytes of the ready messages in a queue this worker reads",
                                 ("queue",))
        self.values = gauge("nebula_value", "Last value of a training quantity (loss...)", ("name",))
        self.dead_letter_alarm = gauge("nebula_dead_letter_alarm",
                                       "1 while the dead-letter queue holds more than [transport] dead_letter_alarm")
        # Set from the worker's status writes, with TLS only (runtime.cert_expiry).
        self.certificate_expiry = gauge("nebula_certificate_expiry_timestamp_seconds",
                                        "When the client certificate this worker logs in with expires (unix time)")
        self.started = gauge("nebula_started_timestamp", "Worker start time")
        self.of(self.started).set(time.time())
        for unlabelled in (self.steps, self.step, self.compute_s, self.wait_s, self.dead_letter_alarm):
            self.of(unlabelled)  # exported from the start (at 0), as a series without labels would be
        self.role = role
        if port:
            try:
                start_http_server(port, registry=r)
            except OSError as exc:  # busy or privileged port: the user's choice, not a crash
                raise WorkerError(f"cannot serve metrics on port {port} ({exc.strerror or exc}): "
                                  f"choose another --metrics-port") from None
            except (OverflowError, ValueError):
                raise WorkerError(f"metrics port must be in 1..65535, got {port}") from None

    def of(self, metric: M, *labels: str) -> M:
        """``metric``'s series for this worker and ``labels``."""
        return metric.labels(*self.identity, *labels)

    def on_published(self, event: MessageEvent) -> None:
        self.of(self.messages, event.flow, "out").inc()
        self.of(self.raw_bytes, event.flow, "out").inc(event.raw_bytes)
        self.of(self.wire_bytes, event.flow, "out").inc(event.wire_bytes)

    def on_received(self, event: MessageEvent) -> None:
        self.of(self.messages, event.flow, "in").inc()
        self.of(self.raw_bytes, event.flow, "in").inc(event.raw_bytes)
        self.of(self.wire_bytes, event.flow, "in").inc(event.wire_bytes)
        if event.redelivered:
            self.of(self.redeliveries, event.flow).inc()

    def on_duplicate(self, event: MessageEvent) -> None:
        self.of(self.duplicates, event.flow).inc()

    def on_dead_letter(self, event: MessageEvent, reason: str, detail: str) -> None:
        self.of(self.dead_letters, event.flow, reason).inc()

    def on_step(self, step: int, values: Mapping[str, float]) -> None:
        self.of(self.steps).inc()
        self.of(self.step).set(step)
        for name, value in values.items():
            self.of(self.values, name).set(value)
        self.flush()

    def on_compute(self, seconds: float) -> None:
        self.of(self.compute_s).inc(seconds)

    def on_wait(self, seconds: float) -> None:
        self.of(self.wait_s).inc(seconds)

    def on_queue_depth(self, queue: str, messages: int, message_bytes: int | None = None) -> None:
        self.of(self.queue_messages, queue).set(messages)
        if message_bytes is not None:
            self.of(self.queue_bytes, queue).set(message_bytes)

    def flush(self) -> None:
        """Write the textfile (skipped on a full disk)."""
        textfile = self.textfile
        if textfile is None:
            return

        def write() -> None:
            textfile.parent.mkdir(parents=True, exist_ok=True)
            write_to_textfile(str(textfile), self.registry)
        self.textfile_write(write)


def _skipped(what: str, problem: str) -> None:
    log.warning("write_skipped", what=what, error=problem, hint="the disk is full: the next step writes it again")


def read_metrics(path: Path) -> dict[str, float]:
    """Sum of each sample name over its labels, plus ``name{flow=...}`` entries."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    if not path.exists():
        return out
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
            if "flow" in sample.labels:
                key = f"{sample.name}{{flow={sample.labels['flow']}}}"
                out[key] = out.get(key, 0.0) + sample.value
    return out
