"""One side (encoder on S or decoder on T) of a study row, as its own process.

On the real stack each side runs in its own OS process, as it would on its own
cluster: with both in one interpreter the GIL serialises their Python work and
the measured step time would not show S and T computing at the same time.
``python -m nebula_mq.study.side SPEC enc|dec`` builds the worker from the
row's spec (a JSON file written by :func:`nebula_mq.study.runner.run_row`),
trains, and writes its traffic counters next to the spec.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nebula_mq import topology
from nebula_mq.runtime.driver import Driver
from nebula_mq.runtime.hooks import Hook, MessageEvent
from nebula_mq.settings import ClusterSettings, CodecSettings, JobSettings, Settings, TransportSettings

SIDES = ("enc", "dec")
WORKER_IDS = {"enc": "enc-0", "dec": "dec-0"}


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

    def to_json(self) -> dict[str, Any]:
        return {"raw": self.raw, "wire": self.wire, "messages": self.messages, "compute_s": self.compute_s}


@dataclass(frozen=True)
class RowSpec:
    """Everything both sides of one row must agree on (written as JSON for the side processes)."""

    job_id: str
    run_dir: str
    src: str  # cluster of the encoder (S)
    tgt: str  # cluster of the decoder (T)
    row: Mapping[str, Any]  # StudyRow fields
    abnet: Mapping[str, Any]  # the job's [abnet] section (StudyConfig.abnet_section)
    steps: int
    seed: int
    stack_dir: str | None = None  # the side processes take broker settings from this stack
    vhost: str = "/"

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def read(cls, path: Path) -> RowSpec:
        return cls(**json.loads(path.read_text()))


def stack_clusters(stack: Any, src: str, tgt: str, vhost: str) -> dict[str, ClusterSettings]:
    """Broker settings of the study's two workers on a local stack (enc-0 on S, dec-0 on T)."""
    return {src: ClusterSettings(src, stack.broker_settings(src, WORKER_IDS["enc"], vhost=vhost)),
            tgt: ClusterSettings(tgt, stack.broker_settings(tgt, WORKER_IDS["dec"], vhost=vhost))}


def provision(stack: Any, job_id: str, src: str, tgt: str) -> str:
    """The row's job on the stack: flows and least-privilege identities; returns its vhost."""
    flows = topology.abnet_flows(src, tgt, (WORKER_IDS["enc"],))
    return str(stack.provision_job(job_id, flows, {src: [WORKER_IDS["enc"]], tgt: [WORKER_IDS["dec"]]}))


def settings(spec: RowSpec, clusters: Mapping[str, ClusterSettings]) -> Settings:
    row = spec.row
    return Settings(
        job=JobSettings(id=spec.job_id, scenario="abnet", seed=spec.seed, steps=spec.steps, run_dir=spec.run_dir),
        clusters=dict(clusters),
        codec=CodecSettings(forward=row["forward"], backward=row["backward"],
                            compress_from_step=row["compress_from_step"]),
        transport=TransportSettings(publish_patience_s=600.0),
        abnet={**spec.abnet, "head_cluster": spec.src, "tail_cluster": spec.tgt},
    )


def make_driver(side: str, s: Settings, transport: Any = None) -> Driver:
    """The runtime's driver of the ABNet encoder (``enc``) or decoder (``dec``) role."""
    from workers.abnet.decoder import AbnetDecoder
    from workers.abnet.encoder import AbnetEncoder

    cls = AbnetEncoder if side == "enc" else AbnetDecoder
    identity = cls.identity(s)
    worker = identity.worker(transport) if transport is not None else identity.broker_worker()
    return Driver(worker, cls(s, worker))


def counters_path(spec_path: Path, side: str) -> Path:
    return spec_path.with_name(f"{spec_path.stem}-{side}-traffic.json")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in SIDES:
        print("usage: python -m nebula_mq.study.side SPEC.json enc|dec", file=sys.stderr)
        return 2
    from nebula_mq.runtime.logs import configure_logging
    from nebula_mq.stack import Stack

    from nebula_mq.models.cpu import configure_cpu

    configure_logging("warning", json=True)  # the parent keeps stderr as the side's log
    configure_cpu()  # MKL's fast path and this side's share of the cores (NEBULA_THREADS)
    spec_path, side = Path(argv[0]), argv[1]
    spec = RowSpec.read(spec_path)
    if spec.stack_dir is None:
        print("the spec names no stack: side processes need real brokers", file=sys.stderr)
        return 2
    driver = make_driver(side, settings(spec, stack_clusters(Stack.open(spec.stack_dir), spec.src, spec.tgt,
                                                             spec.vhost)))
    counter = TrafficCounter(driver.worker, spec.steps)
    driver.worker.hooks.add(counter)
    driver.install_signal_handlers()
    code = int(driver.main())
    counters_path(spec_path, side).write_text(json.dumps(counter.to_json()))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
