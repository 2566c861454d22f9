"""Use what a split job trained: both halves with the weights of their last shared checkpoint.

Checkpoints live under ``<run_dir>/checkpoints/<worker>/step-NNNNNNNNN/`` (``arrays.npz``:
``<side>/param/<name>`` weights by the model's structured parameter names,
``<side>/opt/<name>/<slot>`` optimizer state, per-flow compression state;
``meta.json``: step, digest). Both sides checkpoint at the same steps, so the
newest step that rank 0 of each side holds is a consistent pair: the head's
weights and the tail's weights after the same gradients.

:func:`load` rebuilds a side's model with the builder the job file names
(``[split] head`` / ``tail``) and sets those weights; :func:`predict` runs
head then tail on new inputs in this process, the activation handed over as
numpy exactly as it would cross the WAN (uncompressed); :func:`export` writes
each side's weights in its framework's own format with a manifest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from nebula_mq.data.corpus_io import sha256_file
from nebula_mq.errors import CheckpointError, ConfigError
from nebula_mq.models.frameworks import Framework, framework_of
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.settings import Settings
from workers.registry import load_job_settings
from workers.split.job import HeadSpec, TailSpec, load_spec, load_split_job

Side = Literal["head", "tail"]
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class TrainedSide:
    """One half of the model, in eval mode, with the weights of checkpoint ``step``."""

    side: Side
    model: Any
    framework: Framework
    step: int
    checkpoint_digest: str
    spec: HeadSpec | TailSpec


def _settings(job: str | os.PathLike[str] | Settings) -> Settings:
    return job if isinstance(job, Settings) else load_job_settings(job)


def shared_step(settings: Settings) -> int:
    """The newest step at which rank 0 of both sides holds a checkpoint."""
    split = load_split_job(settings)
    stores = {side: CheckpointStore(settings.run_dir / "checkpoints" / worker)
              for side, worker in (("head", split.head_ids()[0]), ("tail", split.tail_ids()[0]))}
    steps = {side: set(store.steps()) for side, store in stores.items()}
    common = steps["head"] & steps["tail"]
    if not common:
        raise CheckpointError(f"no checkpoint pair under {settings.run_dir / 'checkpoints'}: head has "
                              f"{sorted(steps['head'])}, tail has {sorted(steps['tail'])}; train the job first")
    return max(common)


def load(job: str | os.PathLike[str] | Settings, side: Side, step: int | None = None) -> TrainedSide:
    """``side``'s model built by the job's builder, with the weights of ``step`` (default: the
    newest checkpoint both sides share), in eval mode."""
    settings = _settings(job)
    if side not in ("head", "tail"):
        raise ConfigError(settings.source or "<settings>", "side", "head or tail", side)
    split = load_split_job(settings)
    step = shared_step(settings) if step is None else step
    worker = (split.head_ids() if side == "head" else split.tail_ids())[0]
    ck = CheckpointStore(settings.run_dir / "checkpoints" / worker).load(step)
    spec = load_spec(settings, side)
    fw = framework_of(spec.model, f"split.{side}", getattr(split, f"{side}_framework"))
    fw.load_weights(side, spec.model, ck.arrays)
    spec.model.eval()
    return TrainedSide(side, spec.model, fw, step, ck.digest, spec)


def predict(job: str | os.PathLike[str] | Settings, inputs: Sequence[np.ndarray],
            halves: tuple[TrainedSide, TrainedSide] | None = None) -> np.ndarray:
    """The tail model's output for ``inputs`` (the arrays the head model takes, as
    ``inputs(mb)[1:]`` gives them): head, then tail, without gradients."""
    head, tail = halves if halves is not None else (load(job, "head"), load(job, "tail"))
    with head.framework.no_grad():
        activation = head.framework.numpy(head.model(*(head.framework.tensor(np.asarray(a)) for a in inputs)))
    with tail.framework.no_grad():
        out = tail.model(tail.framework.tensor(np.asarray(activation, dtype=np.float32)))
        return tail.framework.numpy(out)


def export(job: str | os.PathLike[str] | Settings, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Write each side's weights in its framework's format into ``out`` beside ``manifest.json``
    (job, step, codecs, per side: framework, file, sha256, checkpoint digest); the manifest."""
    settings = _settings(job)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    step = shared_step(settings)
    sides: dict[str, Any] = {}
    for side in ("head", "tail"):
        trained = load(settings, side, step)
        path = trained.framework.save_model(trained.model, out_dir / side)
        sides[side] = {"framework": trained.framework.name, "file": path.name, "sha256": sha256_file(path),
                       "checkpoint_digest": trained.checkpoint_digest,
                       "builder": getattr(load_split_job(settings), side)}
    manifest = {"job": settings.job.id, "scenario": settings.job.scenario, "step": step,
                "codecs": {"forward": settings.codec.forward, "backward": settings.codec.backward},
                "sides": sides}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
