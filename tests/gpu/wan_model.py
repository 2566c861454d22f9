"""The model `bench wan` trains on the GPU machine (tests/gpu/wan.sh, tests/gpu/wan-job.toml):
an MLP cut where a split-learning user would cut it, at a narrow layer, so that the GPU's
work per step outweighs what crosses the WAN.

    head (cluster S): FEATURES -> WIDTH (ReLU) -> ... LAYERS wide layers ... -> CUT
    tail (cluster T): CUT -> WIDTH (ReLU) -> ... LAYERS wide layers ... -> 1, mean squared error

The task is the split example's, y = sin(x @ w) + noise, on a fixed synthetic pool drawn once
from the job's seed (numpy): both sides draw the same pool, the head keeps the features, the
tail the labels, and micro-batch ``mb``'s sample ids come from a seeded per-epoch permutation,
so a micro-batch is a pure function of (seed, mb) and a restarted side rebuilds it exactly.

Sizes (GPU defaults; ``NEBULA_GPU_WAN_<NAME>`` overrides each, for the tiny CPU rehearsal:
``[split]`` refuses keys it does not know, so they cannot travel in the job file):

    FEATURES 1024, WIDTH 4096, LAYERS 6, CUT 32, BATCH 1024, SAMPLES 16384

What a step moves at these sizes: the activation is BATCH x CUT = 1024 x 32 values, 65,536 bytes
as fp16 (8.7 ms of a 60 Mbit/s link, 52 ms of 10 Mbit/s); the gradient back is 32,768 bytes as
int8 plus its scales (4.4 / 26 ms). The compute: the head is 5 WIDTH x WIDTH layers plus the
first and the cut (88.5 M parameters, 181 GFLOP forward at batch 1024; forward, the recompute,
backward: ~0.72 TFLOP a step), the tail the same less the input layer (84.2 M, 173 GFLOP
forward, ~0.52 TFLOP a step): ~12-15 ms and ~9-11 ms on an H100/H200 in fp32 (TF32 off, about
50-60 TFLOP/s), more than the activation's wire time at 60 Mbit/s, so a pipeline that hides the
link keeps the GPU as busy as inside one cluster. (At CUT 128 the activation alone would take
35 ms of a 60 Mbit/s link, 2.5x the compute: no pipeline could.) A checkpoint holds the
parameters and Adam's two moments: ~1.06 GB a side.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn

ENV_PREFIX = "NEBULA_GPU_WAN_"


@dataclass(frozen=True)
class Size:
    """The model and data sizes: the GPU sizes unless NEBULA_GPU_WAN_<FIELD> says otherwise."""

    features: int = 1024
    width: int = 4096
    layers: int = 6  # wide layers on each side
    cut: int = 32  # the activation's width: what crosses the WAN
    batch: int = 1024
    samples: int = 16384

    @classmethod
    def from_env(cls) -> Size:
        return cls(**{f.name: int(os.environ[ENV_PREFIX + f.name.upper()]) for f in fields(cls)
                      if ENV_PREFIX + f.name.upper() in os.environ})

    def activation_bytes(self) -> int:
        return self.batch * self.cut * 2  # fp16

    def forward_flops(self, side: str) -> int:
        w, n = self.width, self.layers
        macs = (n - 1) * w * w + (self.features * w + w * self.cut if side == "head" else self.cut * w + w)
        return 2 * self.batch * macs


def _fp32_exact() -> None:
    """Plain fp32 matrix products (no TF32): the compute the sizes above are reckoned in."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@lru_cache(maxsize=2)
def dataset(size: Size, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Features [samples, features] and labels [samples, 1], float32."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size.samples, size.features), dtype=np.float32)
    w = (rng.standard_normal((size.features, 1)) / np.sqrt(size.features)).astype(np.float32)
    y = np.sin(x @ w) + 0.05 * rng.standard_normal((size.samples, 1), dtype=np.float32)
    return x, y.astype(np.float32)


def batch_ids(size: Size, mb: int, seed: int) -> np.ndarray:
    """Sample ids of micro-batch ``mb``: a fresh permutation per epoch, the same on both sides."""
    epoch, k = divmod(mb, size.samples // size.batch)
    order = np.random.default_rng([seed, epoch]).permutation(size.samples)
    return order[k * size.batch:(k + 1) * size.batch].astype(np.int64)


def _mlp(widths: list[int], seed: int) -> nn.Sequential:
    """Linear layers through ``widths``, ReLU between them (none after the last)."""
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        mods.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def bottom(size: Size, seed: int) -> nn.Module:
    """The head half: features -> LAYERS wide layers -> the narrow cut."""
    return _mlp([size.features] + [size.width] * size.layers + [size.cut], seed)


def top(size: Size, seed: int) -> nn.Module:
    """The tail half: the cut -> LAYERS wide layers -> one output."""
    return _mlp([size.cut] + [size.width] * size.layers + [1], seed + 1)


def _seed(settings: Any) -> int:
    return int(getattr(getattr(settings, "job", None), "seed", 0))


# ---- builders named in wan-job.toml ----------------------------------------------------------

def build_head(settings: Any) -> Any:
    from workers.split import HeadSpec

    _fp32_exact()
    size, seed = Size.from_env(), _seed(settings)
    x, _ = dataset(size, seed)  # S uses only the features
    return HeadSpec(model=bottom(size, seed), inputs=lambda mb: (ids := batch_ids(size, mb, seed), x[ids]))


def build_tail(settings: Any) -> Any:
    from workers.split import TailSpec

    _fp32_exact()
    size, seed = Size.from_env(), _seed(settings)
    _, y = dataset(size, seed)  # T uses only the labels
    return TailSpec(model=top(size, seed), loss=nn.functional.mse_loss, targets=lambda ids: y[ids])


if __name__ == "__main__":  # the sizes in force and what they cost
    s = Size.from_env()
    print(s, f"activation {s.activation_bytes():,} B fp16;",
          *(f"{side} {s.forward_flops(side) / 1e9:.1f} GFLOP forward;" for side in ("head", "tail")))
