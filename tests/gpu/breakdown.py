"""Where a step of the GPU check's job goes (tests/gpu/README.md, "Last run").

Runs the check's job (wide_mlp, batch 512, fp16 activations, int8 gradients) for ``--steps``
steps four times, side by side: the host path (the fp16 cast and its decode in numpy, as
before the device narrowing) and the device path (the activation narrowed on the GPU, decoded
through the table), twice each, and prints their rates and ratio. Then it times each piece a
step is made of, alone, on the same device and at the same sizes, median of ``--repeat``:

* compute: the head's forward without grad, its recompute with grad and backward, Adam; the
  tail's forward, loss, backward and Adam (``torch.cuda.synchronize`` around each);
* the host path: the activation to the host (``.cpu().numpy()``) and the gradient back;
* the codecs: fp16 encode + decode of the activation, int8 encode + decode of the gradient.

It prints each piece in ms per step and as a share of the run's measured ms per step. The
two sides run at once, so the shares do not add up: the slower side's pieces bound the step,
and the rest (envelope, signing, the in-memory broker, the two threads' hand-offs, Python,
and on a 2-core machine the sides' contention for the cores) is the difference.
Information only: no pass or fail.

    python3 tests/gpu/breakdown.py [--steps 100] [--repeat 30] [--cpu-only]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from jobs import run_pair, settings  # noqa: E402
from nebula_mq.models.frameworks.torch_backend import fp16_narrowed  # noqa: E402
from nebula_mq.codecs import parse_codec  # noqa: E402
from nebula_mq.codecs.decoding import decode_tree  # noqa: E402
from nebula_mq.transport.memory import MemoryBroker  # noqa: E402
from wide_mlp import Size, dataset, head_spec, tail_spec  # noqa: E402


@contextlib.contextmanager
def host_path() -> Iterator[None]:
    """The activation's fp16 cast and decode as they were before the device narrowing and the
    decode table: numpy's astype on the host, both ways."""
    from nebula_mq.codecs.cast import FP16
    from nebula_mq.models.frameworks.torch_backend import TorchFramework

    narrow, decode = TorchFramework.narrow_fp16, FP16._decode
    TorchFramework.narrow_fp16 = lambda self, tensor: None  # type: ignore[method-assign]
    FP16._decode = lambda self, parts, shape, dtype: parts[0].astype(dtype)  # type: ignore[method-assign]
    try:
        yield
    finally:
        TorchFramework.narrow_fp16, FP16._decode = narrow, decode  # type: ignore[method-assign]


def median_ms(fn: Callable[[], object], repeat: int, cuda: bool) -> float:
    """The median wall time of ``fn`` in ms, after two warm-ups, the device synchronised."""
    times = []
    for i in range(repeat + 2):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--cpu-only", action="store_true")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu_only
    size = Size() if cuda else Size(hidden=256, batch=64, samples=4096)
    dev = torch.device("cuda" if cuda else "cpu")
    rates: dict[str, list[float]] = {"host": [], "device": []}
    with tempfile.TemporaryDirectory(prefix="nebula-gpu-breakdown-") as tmp:
        for i, path in enumerate(("host", "device", "host", "device")):  # side by side, twice each
            with host_path() if path == "host" else contextlib.nullcontext():
                run = run_pair(size, settings(Path(tmp) / f"{path}{i}", "gpu" if cuda else "cpu", args.steps,
                                              size.lr()), MemoryBroker())
            rates[path].append(run.steps_per_s)
    step_ms = 1e3 / statistics.median(rates["device"])

    head, tail = head_spec(size).model.to(dev), tail_spec(size).model.to(dev)
    h_opt, t_opt = torch.optim.Adam(head.parameters(), 1e-4), torch.optim.Adam(tail.parameters(), 1e-4)
    x_all, y_all = dataset(size)
    x = torch.from_numpy(x_all[:size.batch]).to(dev)
    y = torch.from_numpy(y_all[:size.batch]).to(dev)
    act = head(x).detach()
    grad = torch.randn_like(act) * 1e-3
    act_np, grad_np = act.cpu().numpy(), grad.cpu().numpy()
    fp16, int8 = parse_codec("fp16"), parse_codec("int8")

    def head_step() -> None:
        with torch.no_grad():
            head(x)  # the send's forward
        out = head(x)  # the recompute when the gradient arrives
        out.backward(grad)
        h_opt.step()
        h_opt.zero_grad()

    def tail_step() -> None:
        a = act.clone().requires_grad_(True)
        loss = torch.nn.functional.mse_loss(tail(a), y)
        loss.backward()
        t_opt.step()
        t_opt.zero_grad()

    rows = [
        ("head compute (forward, recompute, backward, Adam)", median_ms(head_step, args.repeat, cuda)),
        ("tail compute (forward, loss, backward, Adam)", median_ms(tail_step, args.repeat, cuda)),
        ("activation to host + gradient to device", median_ms(
            lambda: (act.cpu().numpy(), torch.from_numpy(grad_np).to(dev)), args.repeat, cuda)),
        ("fp16 encode + decode of the activation", median_ms(
            lambda: decode_tree(fp16.encode(act_np)), args.repeat, False)),
        ("int8 encode + decode of the gradient", median_ms(
            lambda: decode_tree(int8.encode(grad_np)), args.repeat, False)),
        ("activation narrowed to fp16 on its device, to host", median_ms(
            lambda: fp16_narrowed(act), args.repeat, cuda)),
        ("fp16 decode of the activation (the tail)", median_ms(
            lambda: decode_tree(fp16.encode(act_np)), args.repeat, False) - median_ms(
            lambda: fp16.encode(act_np), args.repeat, False)),
    ]
    where = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"\nwhere a step goes: {size.describe()}, on {where}, {torch.get_num_threads()} CPU threads")
    host, device = statistics.median(rates["host"]), statistics.median(rates["device"])
    print(f"runs: {args.steps} steps each, host path then device path, twice: steps/s host "
          f"{', '.join(f'{r:.2f}' for r in rates['host'])}; device {', '.join(f'{r:.2f}' for r in rates['device'])}")
    print(f"median: host {host:.2f} steps/s, device {device:.2f} steps/s: device / host = {device / host:.2f}x")
    print(f"pieces below are against the device path's {step_ms:.2f} ms a step")
    print(f"{'piece (median of ' + str(args.repeat) + ', alone)':<58}{'ms/step':>9}{'share':>8}")
    for name, ms in rows:
        print(f"{name:<58}{ms:>9.2f}{ms / step_ms:>8.0%}")
    # The head and the tail run at once (two threads, in_flight 2): the slower side bounds the step.
    # On a GPU the head narrows on the device (SplitHead.send_activation): no host cast there.
    copy, fp16_both, int8_both, narrowed, fp16_decode = (r[1] for r in rows[2:7])
    head_path = rows[0][1] + (narrowed + copy / 2 if cuda else copy / 2 + fp16_both - fp16_decode)
    tail_path = rows[1][1] + copy / 2 + fp16_decode + int8_both
    bound = max(head_path, tail_path)
    print(f"{'the slower side, all its pieces (a bound on the step)':<58}{bound:>9.2f}{bound / step_ms:>8.0%}")
    print(f"{'the rest (envelope, auth, broker, hand-offs, Python)':<58}{step_ms - bound:>9.2f}"
          f"{(step_ms - bound) / step_ms:>8.0%}")
    activation_mb = act_np.nbytes / 2**20
    print(f"(activation {tuple(act_np.shape)} float32 = {activation_mb:.1f} MiB per micro-batch)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
