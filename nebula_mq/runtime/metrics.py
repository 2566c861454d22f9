"""Prometheus metrics of one worker, as a hook.

Each worker has its own registry. It is served over HTTP when a port is given
(``/metrics``) and always written to ``<run_dir>/metrics/<role>.prom`` after
each step, so ``nebula-mq status`` can read a worker's figures without a port.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server, write_to_textfile

from nebula_mq.errors import WorkerError
from nebula_mq.runtime.hooks import Hook, MessageEvent


class MetricsHook(Hook):
    def __init__(self, role: str, textfile: str | os.PathLike[str] | None = None,
                 port: int | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.textfile = Path(textfile) if textfile else None
        self.steps = Counter("nebula_steps", "Optimisation steps done", registry=r)
        self.step = Gauge("nebula_step", "Current step", registry=r)
        self.raw_bytes = Counter("nebula_raw_bytes", "Tensor bytes before compression",
                                 ["flow", "direction"], registry=r)
        self.wire_bytes = Counter("nebula_wire_bytes", "Envelope bytes on the wire",
                                  ["flow", "direction"], registry=r)
        self.messages = Counter("nebula_messages", "Messages", ["flow", "direction"], registry=r)
        self.redeliveries = Counter("nebula_redeliveries", "Deliveries flagged redelivered",
                                    ["flow"], registry=r)
        self.duplicates = Counter("nebula_duplicates", "Deliveries discarded as duplicates",
                                  ["flow"], registry=r)
        self.dead_letters = Counter("nebula_dead_letters", "Messages dead-lettered",
                                    ["flow", "reason"], registry=r)
        self.compute_s = Counter("nebula_compute_seconds", "Time spent computing", registry=r)
        self.wait_s = Counter("nebula_wait_seconds", "Time spent waiting on the queues",
                              registry=r)
        self.queue_messages = Gauge("nebula_queue_messages", "Queue depth", ["flow"], registry=r)
        self.queue_bytes = Gauge("nebula_queue_bytes", "Queue size", ["flow"], registry=r)
        self.values = Gauge("nebula_value", "Last value of a training quantity (loss...)",
                            ["name"], registry=r)
        self.started = Gauge("nebula_started_timestamp", "Worker start time", registry=r)
        self.started.set(time.time())
        self.role = role
        if port:
            try:
                start_http_server(port, registry=r)
            except OSError as exc:  # busy or privileged port: the user's choice, not a crash
                raise WorkerError(f"cannot serve metrics on port {port} ({exc.strerror or exc}): "
                                  f"choose another --metrics-port") from None
            except (OverflowError, ValueError):
                raise WorkerError(f"metrics port must be in 1..65535, got {port}") from None

    def on_published(self, event: MessageEvent) -> None:
        self.messages.labels(event.flow, "out").inc()
        self.raw_bytes.labels(event.flow, "out").inc(event.raw_bytes)
        self.wire_bytes.labels(event.flow, "out").inc(event.wire_bytes)

    def on_received(self, event: MessageEvent) -> None:
        self.messages.labels(event.flow, "in").inc()
        self.raw_bytes.labels(event.flow, "in").inc(event.raw_bytes)
        self.wire_bytes.labels(event.flow, "in").inc(event.wire_bytes)
        if event.redelivered:
            self.redeliveries.labels(event.flow).inc()

    def on_duplicate(self, event: MessageEvent) -> None:
        self.duplicates.labels(event.flow).inc()

    def on_dead_letter(self, event: MessageEvent, reason: str, detail: str) -> None:
        self.dead_letters.labels(event.flow, reason).inc()

    def on_step(self, step: int, values: Mapping[str, float]) -> None:
        self.steps.inc()
        self.step.set(step)
        for name, value in values.items():
            self.values.labels(name).set(value)
        self.flush()

    def on_compute(self, seconds: float) -> None:
        self.compute_s.inc(seconds)

    def on_wait(self, seconds: float) -> None:
        self.wait_s.inc(seconds)

    def on_queue_depth(self, flow: str, messages: int, size_bytes: int) -> None:
        self.queue_messages.labels(flow).set(messages)
        self.queue_bytes.labels(flow).set(size_bytes)

    def flush(self) -> None:
        if self.textfile is not None:
            self.textfile.parent.mkdir(parents=True, exist_ok=True)
            write_to_textfile(str(self.textfile), self.registry)


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
