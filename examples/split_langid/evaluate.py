"""Score a split_langid run on the held-out strings, against the trivial baselines.

    python examples/split_langid/evaluate.py examples/split_langid/job.toml
    python examples/split_langid/evaluate.py examples/split_langid/replicas.toml

For the split job (job.toml): both halves with the weights of their newest shared checkpoint
(``workers.split.load``); prints the checkpoint's step, the held-out cross-entropy beside ln K
(the uniform guess), the accuracy beside the largest class's share, and each language's accuracy.

For the replicas job (replicas.toml): the whole model (langid_replicas.py) with the outer
weights of replica-0's newest checkpoint (equal on every replica after each outer step);
prints one line: the accuracy beside the largest class's share, and the loss beside ln K.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import numpy as np
import torch

from langid_data import LangData, dataset
from nebula_mq.errors import CheckpointError, NebulaError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.logs import configure_logging
from nebula_mq.settings import Settings
from workers.registry import load_job_settings
from workers.split import load, predict
from workers.split.trained import TrainedSide

OUTER = "outer/param/"  # the replicas' outer weights θ in a checkpoint, by torch parameter name


def score_logits(logits_of: Callable[[np.ndarray], torch.Tensor], data: LangData,
                 batch: int = 500) -> tuple[float, np.ndarray]:
    """(mean held-out cross-entropy, predicted labels) of ``logits_of(bytes) -> logits``."""
    losses, predicted = [], []
    for start in range(0, len(data.test_labels), batch):
        logits = logits_of(data.test_bytes[start:start + batch])
        y = torch.from_numpy(data.test_labels[start:start + batch])
        losses.append(float(torch.nn.functional.cross_entropy(logits, y, reduction="sum")))
        predicted.append(logits.argmax(dim=1).numpy())
    return sum(losses) / len(data.test_labels), np.concatenate(predicted)


def score(settings: Settings, halves: tuple[TrainedSide, TrainedSide], data: LangData,
          batch: int = 500) -> tuple[float, np.ndarray]:
    """(mean held-out cross-entropy, predicted labels) of head then tail."""
    return score_logits(lambda x: torch.from_numpy(predict(settings, [x], halves)), data, batch)


def outer_model(settings: Settings, data: LangData) -> tuple[int, torch.nn.Module]:
    """(sync event, the whole model in eval mode) with the outer weights of replica-0's newest
    checkpoint. The outer weights, not the replica's own model: with overlap the model mixes
    in its local steps, while θ is what every replica agrees on."""
    from langid_replicas import whole  # next to this file, as the job's [replicas] model

    from workers.replicas.job import replica_id

    root = settings.run_dir / "checkpoints" / replica_id(0)
    ck = CheckpointStore(root).latest()
    if ck is None:
        raise CheckpointError(f"no checkpoint under {root}")
    model = whole(len(data.languages))
    names = [name for name, _ in model.named_parameters()]
    missing = [name for name in names if OUTER + name not in ck.arrays]
    if missing:  # another model's checkpoint (other languages, another example)
        raise CheckpointError(f"{root}: step {ck.step} lacks {OUTER}{missing[0]} ({len(missing)} of {len(names)})")
    weights = {name: torch.from_numpy(np.array(ck.arrays[OUTER + name], np.float32)) for name in names}
    model.load_state_dict(weights, strict=False)  # the model has no buffers: parameters are all of it
    return ck.step, model.eval()  # eval: no dropout


def report_replicas(settings: Settings, data: LangData) -> None:
    from workers.replicas.job import load_job

    step, model = outer_model(settings, data)
    with torch.no_grad():
        loss, predicted = score_logits(lambda x: model(torch.from_numpy(x)), data)
    uniform, majority = data.baseline()
    rounds = step / load_job(settings).fragments  # a sync event is one fragment's outer step
    print(f"replica-0 outer weights after {rounds:g} rounds: held-out accuracy "
          f"{(predicted == data.test_labels).mean():.3f}   baseline {majority:.3f} (largest class)   "
          f"loss {loss:.3f} (ln {len(data.languages)} = {uniform:.3f})")


def report_split(settings: Settings, data: LangData) -> None:
    halves = (load(settings, "head"), load(settings, "tail"))
    loss, predicted = score(settings, halves, data)
    uniform, majority = data.baseline()
    correct = predicted == data.test_labels
    print(f"checkpoint: step {halves[0].step} of both sides ({settings.run_dir})")
    print(f"held-out: {len(data.test_labels)} strings, {len(data.languages)} languages, "
          f"{len(data.train_labels)} training strings")
    print(f"held-out loss {loss:.3f}   baseline ln {len(data.languages)} = {uniform:.3f} (uniform guess)")
    print(f"held-out accuracy {correct.mean():.3f}   baseline {majority:.3f} (largest class)")
    print("per language: " + "  ".join(f"{lang} {correct[data.test_labels == k].mean():.2f}"
                                       for k, lang in enumerate(data.languages)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("job", help="the job file (examples/split_langid/job.toml or replicas.toml)")
    args = parser.parse_args(argv)
    configure_logging("warning")  # not the catalogue reader's skipped-file lines
    try:
        settings = load_job_settings(args.job)
        data = dataset()
        if settings.job.scenario == "replicas":
            report_replicas(settings, data)
        else:
            report_split(settings, data)
    except NebulaError as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
