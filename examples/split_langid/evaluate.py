"""Score a split_langid run on the held-out strings: both halves with the weights of their
newest shared checkpoint (``workers.split.load``), against the trivial baselines.

    python examples/split_langid/evaluate.py examples/split_langid/job.toml

Prints the checkpoint's step, the held-out cross-entropy beside ln K (the uniform guess),
the accuracy beside the largest class's share, and each language's accuracy.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from langid_data import LangData, dataset
from nebula_mq.errors import NebulaError
from nebula_mq.runtime.logs import configure_logging
from nebula_mq.settings import Settings
from workers.registry import load_job_settings
from workers.split import load, predict
from workers.split.trained import TrainedSide


def score(settings: Settings, halves: tuple[TrainedSide, TrainedSide], data: LangData,
          batch: int = 500) -> tuple[float, np.ndarray]:
    """(mean held-out cross-entropy, predicted labels) of head then tail."""
    losses, predicted = [], []
    for start in range(0, len(data.test_labels), batch):
        logits = torch.from_numpy(predict(settings, [data.test_bytes[start:start + batch]], halves))
        y = torch.from_numpy(data.test_labels[start:start + batch])
        losses.append(float(torch.nn.functional.cross_entropy(logits, y, reduction="sum")))
        predicted.append(logits.argmax(dim=1).numpy())
    return sum(losses) / len(data.test_labels), np.concatenate(predicted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("job", help="the job file (examples/split_langid/job.toml)")
    args = parser.parse_args(argv)
    configure_logging("warning")  # not the catalogue reader's skipped-file lines
    try:
        settings = load_job_settings(args.job)
        data = dataset()
        halves = (load(settings, "head"), load(settings, "tail"))
    except NebulaError as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return 1
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
