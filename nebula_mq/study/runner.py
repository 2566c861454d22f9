"""Run one study row: an ABNet encoder/decoder pair trained end to end over a link.

Each row is a fresh job (own run dir, own vhost on a stack) with the same
data, seed, steps and link, so only the codec chains differ. The link is
either a real two-node stack with its shaped WAN relay (:class:`StackLink`,
s/step is what a user would see; each side runs as its own process, see
:mod:`nebula_mq.study.side`) or the in-memory broker (:class:`MemoryLink`: no
wire time, both sides as threads of this process; for fast tests).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nebula_mq.errors import WorkerError
from nebula_mq.models.cpu import thread_share_env
from nebula_mq.report.parse import read_history
from nebula_mq.settings import TransportSettings
from nebula_mq.study import side
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
    # Real-data mode (``--real``): what the rows train and evaluate on, and the warm-up.
    domains: tuple[str, ...] = ()
    eval_domains: tuple[str, ...] = ()
    max_source_tokens: int = 0
    warmup_steps: int = 0
    lr_decay: str = "none"  # "none", "cosine" or "linear" after warm-up (see [abnet] lr_decay)
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0

    def abnet_section(self, row: StudyRow) -> dict[str, Any]:
        """The row's job's ``[abnet]`` section: every field but the job's own (steps, seed)."""
        section = {k: v for k, v in asdict(self).items() if k not in ("steps", "seed")}
        return {**section, "domains": list(self.domains), "eval_domains": list(self.eval_domains),
                "in_flight": row.in_flight or self.in_flight,
                "forward_feedback": row.forward_feedback, "backward_feedback": row.backward_feedback}


class Link(ABC):
    """Where a row's brokers are and what the WAN between them looks like."""

    name: str
    rate_mbit: float = 0.0  # 0 = unshaped

    @abstractmethod
    def run(self, spec: side.RowSpec, timeout_s: float) -> dict[str, dict[str, Any]]:
        """Provision the row's job, train both sides to the end; traffic counters per side."""

    def clusters(self) -> tuple[str, str]:
        return ("s", "t")


class MemoryLink(Link):
    """The in-memory broker: both sides as threads of this process (no wire time)."""

    name = "memory"

    def run(self, spec: side.RowSpec, timeout_s: float) -> dict[str, dict[str, Any]]:
        from nebula_mq.transport.memory import MemoryBroker, MemoryTransport

        broker = MemoryBroker()
        transport = TransportSettings(publish_patience_s=60.0)
        s = side.settings(spec, {})
        drivers = {k: side.make_driver(k, s, MemoryTransport(broker, transport, spec.job_id, c))
                   for k, c in (("enc", spec.src), ("dec", spec.tgt))}
        workers = {k: d.worker for k, d in drivers.items()}
        counters = {k: side.TrafficCounter(w, spec.steps) for k, w in workers.items()}
        for k, w in workers.items():
            w.hooks.add(counters[k])
        errors: list[BaseException] = []

        def go(driver: Any) -> None:
            try:
                driver.main()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                for w in workers.values():
                    w.stop_requested.set()

        threads = [threading.Thread(target=go, args=(d,), name=d.worker_id) for d in drivers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s)
        if any(t.is_alive() for t in threads):
            for w in workers.values():
                w.stop_requested.set()
            raise WorkerError(f"row {spec.job_id}: workers still running after {timeout_s} s")
        if errors:
            raise WorkerError(f"row {spec.job_id}: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
        return {k: c.to_json() for k, c in counters.items()}


class StackLink(Link):
    """A running :class:`nebula_mq.stack.Stack` (first two clusters: S and T); each side
    is its own process (:mod:`nebula_mq.study.side`), as on two clusters."""

    name = "stack"

    def __init__(self, stack: Any, rate_mbit: float, delay_ms: float = 0.0) -> None:
        self.stack = stack
        self.shape(rate_mbit, delay_ms)

    def shape(self, rate_mbit: float, delay_ms: float = 0.0) -> None:
        self.rate_mbit, self.delay_ms = rate_mbit, delay_ms
        self.stack.link_up(None, rate_mbit=rate_mbit, delay_ms=delay_ms)

    def clusters(self) -> tuple[str, str]:
        return self.stack.clusters[0], self.stack.clusters[1]

    def run(self, spec: side.RowSpec, timeout_s: float) -> dict[str, dict[str, Any]]:
        vhost = side.provision(self.stack, spec.job_id, spec.src, spec.tgt)
        spec = dataclasses.replace(spec, stack_dir=self.stack.layout.run_dir, vhost=vhost)
        run_dir = Path(spec.run_dir)
        path = spec.write(run_dir / "study-spec.json")
        procs: dict[str, subprocess.Popen[bytes]] = {}
        logs = {k: run_dir / f"study-{k}.log" for k in side.SIDES}
        # Each side its share of the cores, as `nebula-mq run` gives its workers (the user's
        # own settings win); two sides with a thread per core each would oversubscribe.
        env = {**thread_share_env(len(side.SIDES)), **os.environ}
        for k in ("dec", "enc"):
            with logs[k].open("wb") as out:
                procs[k] = subprocess.Popen([sys.executable, "-m", "nebula_mq.study.side", str(path), k],
                                            stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        try:
            while True:  # a side that fails stops the row (the other would wait for it forever)
                failed = next((k for k, p in procs.items() if p.poll() not in (None, 0)), None)
                if failed is not None:
                    raise WorkerError(f"row {spec.job_id}: {failed} exited {procs[failed].returncode}\n"
                                      + logs[failed].read_text(errors="replace")[-2000:])
                if all(p.poll() is not None for p in procs.values()):
                    break
                if time.monotonic() > deadline:
                    raise WorkerError(f"row {spec.job_id}: still running after {timeout_s} s")
                time.sleep(0.2)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return {k: json.loads(side.counters_path(path, k).read_text()) for k in side.SIDES}


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


def steady_s_per_step(times: list[float]) -> float:
    if len(times) < 3:
        return float("nan")
    skip = max(1, len(times) // 10)
    return (times[-1] - times[skip]) / (len(times) - 1 - skip)


def run_row(row: StudyRow, cfg: StudyConfig, link: Link, run_dir: Path, timeout_s: float = 3600.0) -> RowResult:
    """Train one row to the end (plus evaluation) and measure it."""
    src, tgt = link.clusters()
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh job: old checkpoints would be resumed
    run_dir.mkdir(parents=True)
    spec = side.RowSpec(job_id=f"study{os.getpid()}-{next(_jobs)}", run_dir=str(run_dir), src=src, tgt=tgt,
                        row=asdict(row), abnet=cfg.abnet_section(row), steps=cfg.steps, seed=cfg.seed)
    t0 = time.perf_counter()
    traffic = link.run(spec, timeout_s)
    wall = time.perf_counter() - t0
    path = run_dir / "history" / f"{side.WORKER_IDS['dec']}.jsonl"
    hist = read_history(path.read_text(), str(path))[0] if path.exists() else ()
    ce, cd = traffic["enc"], traffic["dec"]
    result = RowResult(
        row=row, link=link.name, rate_mbit=link.rate_mbit, steps=cfg.steps,
        s_per_step=steady_s_per_step([h["time"] for h in hist]),
        encoder_compute_s_per_step=ce["compute_s"] / cfg.steps, decoder_compute_s_per_step=cd["compute_s"] / cfg.steps,
        forward_ratio=ce["wire"] / max(ce["raw"], 1), backward_ratio=cd["wire"] / max(cd["raw"], 1),
        forward_bytes_per_step=ce["wire"] / cfg.steps, backward_bytes_per_step=cd["wire"] / cfg.steps,
        wall_s=wall, losses=[h["loss"] for h in hist],
    )
    evaluation = run_dir / "eval.json"  # T's scores
    if evaluation.exists():
        body: Mapping[str, Any] = json.loads(evaluation.read_text())
        result.bleu = float(body["bleu"])
        result.bleu_by_domain = dict(body["bleu_by_domain"])
        result.hypotheses, result.references = list(body["hypotheses"]), list(body["references"])
    return result
