"""Start Scenario II's encoder from the discriminator Scenario I trained (the paper's pipeline:
ABNet is fine-tuned from the ERNIE-M Extra encoder).

``[abnet] encoder_init`` names a Scenario I job file, or a discriminator's checkpoint folder
(``<run_dir>/checkpoints/disc-root`` or one ``step-N`` inside it). The latest root
discriminator checkpoint's encoder (``model/encoder.*``) replaces the ABNet encoder's frozen
stack (``stack.*``), layer by layer; the adapters keep their own initialisation. The stack
is frozen, so it is not in ABNet's checkpoints: the encoder worker applies this at every
start, resumed or not, and the weights are the same each time.

* **Layers**: ABNet's stack keeps its first N layers (``encoder_layers``); the discriminator
  must have at least N, of the same shapes.
* **Positions**: the first rows, as many as ABNet's stack has.
* **Words**: the discriminator of a corpus job (``data = "corpus"``) has a pruned vocabulary
  (new id i = original XLM-R id ``kept[i]``); its rows go to those ids of ABNet's unpruned
  source vocabulary. Otherwise the rows are copied when both vocabularies have the same size,
  and left as they are (said in the log) when they differ, since their ids mean other words.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import paddle

from nebula_mq.errors import CheckpointError, ConfigError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.logs import get_logger
from workers.registry import load_job_settings

log = get_logger(__name__)

SOURCE_PREFIX = "model/encoder."
TARGET_PREFIX = "stack."
WORDS = "embeddings.word.weight"
POSITIONS = "embeddings.position.weight"


def discriminator_state(init: str, source: str) -> tuple[dict[str, np.ndarray], np.ndarray | None, int]:
    """(the encoder arrays of the latest root discriminator checkpoint named by ``init``, the
    kept XLM-R ids of its vocabulary or None, its step)."""
    path = Path(init)  # written in the job file: relative to it already (nebula_mq.config)
    kept: np.ndarray | None = None
    if path.is_file():
        # The Scenario I job as its own file says, whatever overrides this job was given.
        settings = load_job_settings(path, environ={})
        if settings.job.scenario != "electra":
            raise ConfigError(source, "abnet.encoder_init", "a Scenario I (electra) job file or checkpoint folder",
                              f"{init} (scenario {settings.job.scenario})")
        from workers.electra.data import load_data
        from workers.electra.job import load_job

        kept = load_data(settings, load_job(settings)).kept
        path = settings.run_dir / "checkpoints" / "disc-root"
    if (path / "meta.json").is_file():  # one step-N folder
        store, step = CheckpointStore(path.parent), int(path.name.rpartition("-")[2])
    else:
        store = CheckpointStore(path)
        steps = store.steps()
        if not steps:
            raise ConfigError(source, "abnet.encoder_init", "a Scenario I job with a discriminator checkpoint",
                              f"{init} (no checkpoint under {path})")
        step = steps[-1]
    try:
        ck = store.load(step)
    except CheckpointError as exc:
        raise ConfigError(source, "abnet.encoder_init", "a readable discriminator checkpoint", str(exc)) from None
    arrays = {k[len(SOURCE_PREFIX):]: v for k, v in ck.arrays.items() if k.startswith(SOURCE_PREFIX)}
    if not arrays:
        raise ConfigError(source, "abnet.encoder_init", "a root discriminator's checkpoint (model/encoder.*)",
                          f"{init} (step {step} has none)")
    return arrays, kept, step


def word_rows(target: np.ndarray, rows: np.ndarray, kept: np.ndarray | None) -> np.ndarray | None:
    """ABNet's word embeddings with the discriminator's rows in place; None when they cannot map."""
    if kept is not None and len(kept) == len(rows) and int(kept.max()) < len(target):
        out = target.copy()
        out[kept] = rows
        return out
    return rows if rows.shape == target.shape else None


def init_encoder(stack_owner: paddle.nn.Layer, init: str, source: str) -> int:
    """Overwrite ``stack_owner``'s stack (an ABNet ``EncoderSide``) with the discriminator's
    encoder named by ``init``; returns the discriminator's step."""
    arrays, kept, step = discriminator_state(init, source)
    params: Mapping[str, paddle.Tensor] = {n[len(TARGET_PREFIX):]: p for n, p in stack_owner.named_parameters()
                                           if n.startswith(TARGET_PREFIX) and ".after_" not in n}
    copied, skipped = 0, []
    for name, p in params.items():
        shape = tuple(p.shape)
        if name not in arrays:
            raise ConfigError(source, "abnet.encoder_init", f"a discriminator with {name} (ABNet's stack has it)",
                              f"{init} (its encoder lacks it)")
        value = arrays[name]
        if name == WORDS:
            mapped = word_rows(p.numpy(), value, kept)
            if mapped is None:
                skipped.append(name)
                continue
            value = mapped
        elif name == POSITIONS and value.shape[0] >= shape[0]:
            value = value[: shape[0]]
        if tuple(value.shape) != shape:
            raise ConfigError(source, "abnet.encoder_init", f"{name} of shape {shape}",
                              f"{tuple(value.shape)} in {init}")
        p.set_value(np.asarray(value, dtype=np.float32))
        copied += 1
    log.info("encoder_initialised", source=init, disc_step=step, tensors=copied, skipped=skipped,
             vocabulary="mapped by kept ids" if kept is not None else "as is")
    return step
