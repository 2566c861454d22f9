"""Run one study row: an ABNet encoder/decoder pair trained end to end over a link.

Each row is a fresh job (own run dir, own vhost on a stack) with the same
data, seed, steps and link, so only the codec chains differ. Both workers run
as threads of this process (paddle is imported once; the pair is what a
cluster pair would run). The link is either a real two-node stack with its
shaped WAN relay (:class:`StackLink`, s/step is what a user would see) or the
in-memory broker (:class:`MemoryLink`: no wire time, used to measure compute
and in fast tests).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nebula_mq import topology
from nebula_mq.errors import WorkerError
from nebula_mq.runtime.hooks import Hook, MessageEvent
from nebula_mq.settings import ClusterSettings, CodecSettings, JobSettings, Settings, TransportSettings
from nebula_mq.study.rows import StudyRow

_jobs = itertools.count()


@dataclass(frozen=True)
class StudyConfig:
    """What every row shares (the paper's "same data, seed and link")."""

    preset: str = "tiny"
    data: str = "synthetic"  # "synthetic" (tiny preset) or "corpus" (`nebula-mq data build` output)
    data_dir: str = "run/data"
    encoder_layers: int = 6
    decoder_layers: int = 6
    steps: int = 300
    batch_size: int = 16
    in_flight: int = 4  # micro-batches in flight: what lets transfer overlap compute
    lr: float = 3e-3
    seed: int = 0
    # A small training set gives several epochs, which delta compression needs.
    train_samples: int = 512
    eval_samples: int = 128
    eval_beam: int = 4
    eval_max_len: int = 16
    synthetic_len: int = 8
    checkpoint_every: int = 50

    def abnet_section(self, row: StudyRow) -> dict[str, Any]:
        return {
            "preset": self.preset, "data": self.data, "data_dir": self.data_dir,
            "encoder_layers": self.encoder_layers, "decoder_layers": self.decoder_layers,
            "batch_size": self.batch_size, "in_flight": self.in_flight, "lr": self.lr,
            "train_samples": self.train_samples, "eval_samples": self.eval_samples,
            "eval_beam": self.eval_beam, "eval_max_len": self.eval_max_len,
            "synthetic_len": self.synthetic_len, "checkpoint_every": self.checkpoint_every,
            "forward_feedback": row.forward_feedback, "backward_feedback": row.backward_feedback,
        }


class TrafficCounter(Hook):
    """Bytes and compute of the training steps (evaluation traffic is left out)."""

    def __init__(self, worker: Any, total: int) -> None:
        self.worker, self.total = worker, total
        self.raw = self.wire = self.messages = 0
        self.compute_s = 0.0

    def on_published(self, event: MessageEvent) -> None:
        if self.worker.step < self.total:
            self.raw += event.raw_bytes
            self.wire += event.wire_bytes
            self.messages += 1

    def on_compute(self, seconds: float) -> None:
        if self.worker.step < self.total:
            self.compute_s += seconds


class Link(ABC):
    """Where a row's brokers are and what the WAN between them looks like."""

    name: str
    rate_mbit: float = 0.0  # 0 = unshaped

    @abstractmethod
    def prepare(self, job_id: str, src: str, tgt: str) -> tuple[dict[str, ClusterSettings], Any, Any]:
        """Provision the job; (clusters for Settings, encoder transport, decoder transport),
        transports None when workers connect from the settings."""

    def clusters(self) -> tuple[str, str]:
        return ("s", "t")


class MemoryLink(Link):
    name = "memory"

    def __init__(self) -> None:
        self._broker: Any = None

    def prepare(self, job_id: str, src: str, tgt: str) -> tuple[dict[str, ClusterSettings], Any, Any]:
        from nebula_mq.transport.memory import MemoryBroker, MemoryTransport

        self._broker = broker = MemoryBroker()
        transport = TransportSettings(publish_patience_s=60.0)
        return ({}, MemoryTransport(broker, transport, job_id, src), MemoryTransport(broker, transport, job_id, tgt))


class StackLink(Link):
    """A running :class:`nebula_mq.stack.Stack` (first two clusters: S and T)."""

    name = "stack"

    def __init__(self, stack: Any, rate_mbit: float, delay_ms: float = 0.0) -> None:
        self.stack = stack
        self.shape(rate_mbit, delay_ms)

    def shape(self, rate_mbit: float, delay_ms: float = 0.0) -> None:
        self.rate_mbit, self.delay_ms = rate_mbit, delay_ms
        self.stack.shape(None, rate_mbit=rate_mbit, delay_ms=delay_ms, cut=False)

    def clusters(self) -> tuple[str, str]:
        return self.stack.clusters[0], self.stack.clusters[1]

    def prepare(self, job_id: str, src: str, tgt: str) -> tuple[dict[str, ClusterSettings], Any, Any]:
        flows = topology.abnet_flows(src, tgt, ("enc-0",))
        vhost = self.stack.provision_job(job_id, flows, {src: ["enc-0"], tgt: ["dec-0"]})
        return ({src: ClusterSettings(src, self.stack.broker_settings(src, "enc-0", vhost=vhost)),
                 tgt: ClusterSettings(tgt, self.stack.broker_settings(tgt, "dec-0", vhost=vhost))}, None, None)


@dataclass
class RowResult:
    row: StudyRow
    link: str
    rate_mbit: float
    steps: int
    s_per_step: float  # steady state (first 10% of steps left out), decoder's clock
    encoder_compute_s_per_step: float  # forward, recompute, backward, delta bookkeeping
    decoder_compute_s_per_step: float  # loss, backward, error feedback
    forward_ratio: float  # wire bytes / raw bytes of the activation messages
    backward_ratio: float
    forward_bytes_per_step: float
    backward_bytes_per_step: float
    wall_s: float
    losses: list[float]
    bleu: float | None = None
    bleu_by_domain: dict[str, float] = field(default_factory=dict)
    hypotheses: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)

    @property
    def compute_bound_s_per_step(self) -> float:
        """Step time with an infinitely fast wire: the two sides overlap, the slower one bounds."""
        return max(self.encoder_compute_s_per_step, self.decoder_compute_s_per_step)

    @property
    def wire_s_per_step(self) -> float:
        """Wire time of the slower direction at the link's rate (0 when unshaped)."""
        if self.rate_mbit <= 0:
            return 0.0
        return max(self.forward_bytes_per_step, self.backward_bytes_per_step) * 8 / (self.rate_mbit * 1e6)

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body.pop("row")
        return {"chain": self.row.chain, **asdict(self.row), **body, "wire_s_per_step": self.wire_s_per_step,
                "compute_bound_s_per_step": self.compute_bound_s_per_step}


def _history(run_dir: Path, worker: str) -> list[dict[str, float]]:
    path = run_dir / "history" / f"{worker}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def steady_s_per_step(times: list[float]) -> float:
    if len(times) < 3:
        return float("nan")
    skip = max(1, len(times) // 10)
    return (times[-1] - times[skip]) / (len(times) - 1 - skip)


def run_row(row: StudyRow, cfg: StudyConfig, link: Link, run_dir: Path, timeout_s: float = 3600.0) -> RowResult:
    """Train one row to the end (plus evaluation) and measure it."""
    import time

    from workers.abnet_decoder import AbnetDecoderWorker
    from workers.abnet_encoder import AbnetEncoderWorker

    src, tgt = link.clusters()
    job_id = f"study{os.getpid()}-{next(_jobs)}"
    clusters, enc_t, dec_t = link.prepare(job_id, src, tgt)
    settings = Settings(
        job=JobSettings(id=job_id, scenario="abnet", seed=cfg.seed, steps=cfg.steps, run_dir=str(run_dir)),
        clusters=clusters,
        codec=CodecSettings(forward=row.forward, backward=row.backward, compress_from_step=row.compress_from_step),
        transport=TransportSettings(publish_patience_s=600.0),
        abnet={**cfg.abnet_section(row), "src_cluster": src, "tgt_cluster": tgt},
    )
    enc = AbnetEncoderWorker(settings, enc_t)
    dec = AbnetDecoderWorker(settings, dec_t)
    counters = {w.worker_id: TrafficCounter(w, cfg.steps) for w in (enc, dec)}
    for w in (enc, dec):
        w.hooks.add(counters[w.worker_id])
    errors: list[BaseException] = []

    def go(worker: Any) -> None:
        try:
            worker.main()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            enc.stop_requested.set()
            dec.stop_requested.set()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=go, args=(w,), name=w.worker_id) for w in (dec, enc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if any(t.is_alive() for t in threads):
        enc.stop_requested.set()
        dec.stop_requested.set()
        raise WorkerError(f"row {row.chain}: workers still running after {timeout_s} s")
    if errors:
        raise WorkerError(f"row {row.chain}: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
    wall = time.perf_counter() - t0
    hist = _history(run_dir, "dec-0")
    ce, cd = counters["enc-0"], counters["dec-0"]
    result = RowResult(
        row=row, link=link.name, rate_mbit=link.rate_mbit, steps=cfg.steps,
        s_per_step=steady_s_per_step([h["time"] for h in hist]),
        encoder_compute_s_per_step=ce.compute_s / cfg.steps, decoder_compute_s_per_step=cd.compute_s / cfg.steps,
        forward_ratio=ce.wire / max(ce.raw, 1), backward_ratio=cd.wire / max(cd.raw, 1),
        forward_bytes_per_step=ce.wire / cfg.steps, backward_bytes_per_step=cd.wire / cfg.steps,
        wall_s=wall, losses=[h["loss"] for h in hist],
    )
    evaluation = run_dir / "eval" / f"dec-0-{dec.job.eval_split}.json"
    if evaluation.exists():
        body: Mapping[str, Any] = json.loads(evaluation.read_text())
        result.bleu = float(body["bleu"])
        result.bleu_by_domain = dict(body["bleu_by_domain"])
        result.hypotheses, result.references = list(body["hypotheses"]), list(body["references"])
    return result
