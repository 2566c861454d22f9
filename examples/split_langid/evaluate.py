"""Score a split_langid run on the held-out strings: the latest checkpoints of both sides,
put back together, against the trivial baselines.

    python examples/split_langid/evaluate.py examples/split_langid/job.toml

Prints the step of the checkpoints, the held-out cross-entropy beside ln K (the uniform
guess), the accuracy beside the largest class's share, and each language's accuracy.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from langid_data import LangData, dataset
from langid_model import head_model, tail_model
from nebula_mq.errors import NebulaError
from nebula_mq.runtime.checkpoint import CheckpointStore
from nebula_mq.runtime.logs import configure_logging
from nebula_mq.settings import load_settings


def load(model: nn.Module, arrays: Mapping[str, np.ndarray], prefix: str) -> nn.Module:
    """``model`` with the parameters ``<prefix>/param/<name>`` of a checkpoint, in eval mode."""
    params = {k[len(f"{prefix}/param/"):]: torch.from_numpy(np.array(v)) for k, v in arrays.items()
              if k.startswith(f"{prefix}/param/")}
    model.load_state_dict(params, strict=True)
    return model.eval()


def latest(run_dir: Path, worker: str) -> tuple[int, Mapping[str, np.ndarray]]:
    """(step, arrays) of a worker's latest checkpoint."""
    checkpoint = CheckpointStore(run_dir / "checkpoints" / worker).latest()
    if checkpoint is None:
        raise SystemExit(f"evaluate: no checkpoint in {run_dir / 'checkpoints' / worker} (run the job first)")
    return checkpoint.step, checkpoint.arrays


@torch.no_grad()
def score(head: nn.Module, tail: nn.Module, data: LangData, batch: int = 500) -> tuple[float, np.ndarray]:
    """(mean held-out cross-entropy, predicted labels) of head then tail."""
    losses, predicted = [], []
    for start in range(0, len(data.test_labels), batch):
        x = torch.from_numpy(data.test_bytes[start:start + batch])
        y = torch.from_numpy(data.test_labels[start:start + batch])
        logits = tail(head(x))
        losses.append(float(nn.functional.cross_entropy(logits, y, reduction="sum")))
        predicted.append(logits.argmax(dim=1).numpy())
    return sum(losses) / len(data.test_labels), np.concatenate(predicted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", help="the job file (examples/split_langid/job.toml)")
    args = parser.parse_args(argv)
    configure_logging("warning")  # not the catalogue reader's skipped-file lines
    try:
        settings = load_settings(args.job)
        data = dataset()
    except NebulaError as exc:
        print(f"evaluate: {exc}", file=sys.stderr)
        return 1
    head_step, head_arrays = latest(settings.run_dir, "head-0")
    tail_step, tail_arrays = latest(settings.run_dir, "tail-0")
    head = load(head_model(), head_arrays, "head")
    tail = load(tail_model(len(data.languages)), tail_arrays, "tail")
    loss, predicted = score(head, tail, data)
    uniform, majority = data.baseline()
    correct = predicted == data.test_labels
    print(f"checkpoints: head step {head_step}, tail step {tail_step} ({settings.run_dir})")
    print(f"held-out: {len(data.test_labels)} strings, {len(data.languages)} languages, "
          f"{len(data.train_labels)} training strings")
    print(f"held-out loss {loss:.3f}   baseline ln {len(data.languages)} = {uniform:.3f} (uniform guess)")
    print(f"held-out accuracy {correct.mean():.3f}   baseline {majority:.3f} (largest class)")
    print("per language: " + "  ".join(f"{lang} {correct[data.test_labels == k].mean():.2f}"
                                       for k, lang in enumerate(data.languages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
