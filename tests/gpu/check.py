"""The GPU check of the PyTorch split path (issue 27 item 3): ``bash tests/gpu/check.sh``.

Trains a widened split MLP (``wide_mlp``) with both sides on ``cuda`` over the in-memory
transport and checks that: the sides' weights live on the GPU, the loss falls, two
identical runs end with bit-identical checkpoints, and a run stopped at step k and
resumed on the same broker ends where the clean run ends. It measures steps/s on the
GPU against the same job on this machine's CPU, and the peak GPU memory.

Without a GPU it runs the same checks on the CPU (a smaller model unless ``--hidden``
says otherwise), labelled "no GPU: CPU-only dry run". Prints one summary table and
writes it to ``$OUT/gpu_check.txt`` when ``$OUT`` is set; exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
for entry in (str(HERE.parents[1]), str(HERE)):  # the repo (nebula_mq, workers), then tests/gpu
    if entry not in sys.path:
        sys.path.insert(0, entry)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from jobs import WORKERS, Run, compare, run_pair, settings  # noqa: E402
from nebula_mq.runtime.logs import configure_logging  # noqa: E402
from nebula_mq.transport.memory import MemoryBroker  # noqa: E402
from wide_mlp import Size  # noqa: E402

PASS, FAIL, INFO = "PASS", "FAIL", "info"
Row = tuple[str, str, str]  # (check, result, PASS / FAIL / info)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=0, help="steps of each run (default: 200 on a GPU, 40 without)")
    p.add_argument("--cpu-steps", type=int, default=30, help="steps of the CPU baseline run (GPU mode)")
    p.add_argument("--hidden", type=int, default=0, help="hidden width (default: 2048 on a GPU, 256 without)")
    p.add_argument("--batch", type=int, default=0, help="micro-batch (default: 512 on a GPU, 64 without)")
    p.add_argument("--cpu-only", action="store_true", help="ignore the GPU: the dry run")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds one run may take")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    return p.parse_args(argv)


def fmt_rate(rate: float) -> str:
    return "n/a" if math.isnan(rate) else f"{rate:.2f} steps/s"


def third_party() -> str:
    """The third-party distributions this process imported, with versions: what the wheels in
    .whl/ and the machine's own packages must give."""
    from importlib import metadata

    ours = {"nebula_mq", "workers", "jobs", "wide_mlp", "gpu_check_threads", "__main__"}
    tops = {name.partition(".")[0] for name in list(sys.modules)} - ours - set(sys.stdlib_module_names)
    owners = metadata.packages_distributions()
    dists = sorted({dist for top in tops for dist in owners.get(top, [])}, key=str.lower)
    versions = []
    for dist in dists:
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(dist)
    return ", ".join(versions)


class Checker:
    """Runs the checks in order; a check that raises is a FAIL row, and the rest still run."""

    def __init__(self, work: Path, size: Size, device: str, steps: int, timeout: float) -> None:
        self.work, self.size, self.device, self.steps, self.timeout = work, size, device, steps, timeout
        self.rows: list[Row] = []
        self.runs: dict[str, Run] = {}

    def add(self, check: str, result: str, status: str) -> None:
        self.rows.append((check, result, status))
        print(f"  {status:<4}  {check}: {result}", flush=True)

    def attempt(self, check: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - every failure becomes a row
            traceback.print_exc()
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self.add(check, f"{type(exc).__name__}: {first[:160]}", FAIL)

    def job(self, name: str, device: str, steps: int, broker: MemoryBroker | None = None,
            stop_at: int | None = None) -> Run:
        print(f"-- run {name}: {steps} steps on {device}" + (f", stopping at {stop_at}" if stop_at else ""),
              flush=True)
        run = run_pair(self.size, settings(self.work / name, device, steps, self.size.lr()), broker or MemoryBroker(),
                       stop_at, self.timeout)
        print(f"   {run.seconds:.1f} s, {fmt_rate(run.steps_per_s)}", flush=True)
        return run

    # ---------------------------------------------------------------- the checks

    def clean_run(self) -> None:
        run = self.runs["a"] = self.job("a", self.device, self.steps)
        want = "cuda" if self.device == "gpu" else "cpu"
        placed = all(d.startswith(want) for d in run.devices)
        self.add("sides' weights on", f"head {run.devices[0]}, tail {run.devices[1]}", PASS if placed else FAIL)
        self.add("steps done", f"head {run.steps[0]}, tail {run.steps[1]} of {self.steps}",
                 PASS if run.steps == (self.steps, self.steps) else FAIL)
        k = min(5, max(1, len(run.losses) // 10))
        start, end = float(np.mean(run.losses[:k])), float(np.mean(run.losses[-k:]))
        falls = math.isfinite(end) and end < 0.8 * start
        self.add("loss falls", f"{start:.4f} -> {end:.4f} (mean of first/last {k} steps)", PASS if falls else FAIL)
        self.add(f"steps/s on {want}", fmt_rate(run.steps_per_s), INFO)
        if self.device == "gpu":
            self.add("peak GPU memory", f"{run.peak_mib:.0f} MiB (torch.cuda.max_memory_allocated)", INFO)

    def cpu_baseline(self, cpu_steps: int) -> None:
        run = self.job("cpu", "cpu", cpu_steps)
        self.add("steps/s on cpu", f"{fmt_rate(run.steps_per_s)} ({torch.get_num_threads()} threads, "
                 f"{cpu_steps} steps)", INFO)
        gpu = self.runs["a"].steps_per_s
        self.add("speed-up cuda / cpu", f"{gpu / run.steps_per_s:.1f}x", INFO)
        shutil.rmtree(run.run_dir, ignore_errors=True)

    def identical_runs(self) -> None:
        self.runs["b"] = self.job("b", self.device, self.steps)
        for worker in WORKERS:
            same, how = compare(self.work / "a", self.work / "b", worker)
            self.add(f"two identical runs, {worker}", how, PASS if same else FAIL)
        shutil.rmtree(self.work / "b", ignore_errors=True)

    def resume(self) -> None:
        stop_at = self.steps // 2 + 1  # not on a checkpoint: the stop writes its own
        broker = MemoryBroker()
        first = self.job("c", self.device, self.steps, broker, stop_at=stop_at)
        stopped = first.steps == (stop_at, stop_at)
        self.add("stopped at step k", f"head {first.steps[0]}, tail {first.steps[1]} (k = {stop_at})",
                 PASS if stopped else FAIL)
        self.job("c", self.device, self.steps, broker)  # resumed on the same broker
        for worker in WORKERS:
            same, how = compare(self.work / "a", self.work / "c", worker)
            self.add(f"resumed = clean, {worker}", how, PASS if same else FAIL)


    def narrowing(self) -> None:
        """The head's activation narrowed to fp16 on its device (torch_backend.fp16_narrowed)
        must be the bytes numpy's fp16 codec makes on the host, edge values included."""
        from nebula_mq.codecs.cast import FP16
        from nebula_mq.models.frameworks.torch_backend import fp16_narrowed

        device = torch.device("cuda" if self.device == "gpu" else "cpu")
        gen = torch.Generator(device="cpu").manual_seed(3)
        x = torch.randn(self.size.batch, self.size.hidden, generator=gen) * 3e4  # some beyond +-65504
        x.view(-1)[:6] = torch.tensor([65504.0, 65519.99, 65520.0, -7e4, 1e-8, -0.0])
        host = FP16().encode(x.numpy()).leaves()[0]
        narrowed = FP16().encode_narrowed(fp16_narrowed(x.to(device))).leaves()[0]
        same = host.tobytes() == narrowed.tobytes()
        differ = int(np.count_nonzero(host.view(np.uint16) != narrowed.view(np.uint16)))
        self.add(f"fp16 narrowed on {device.type}", f"{x.numel()} values, {'bytes equal to numpy' if same else f'{differ} differ'}",
                 PASS if same else FAIL)


def table(title: str, rows: list[Row]) -> str:
    width = max(len(r[0]) for r in rows)
    lines = [title, "=" * len(title)]
    lines += [f"{status:<4}  {check:<{width}}  {result}" for check, result, status in rows]
    failed = sum(r[2] == FAIL for r in rows)
    lines.append(f"{'OK' if not failed else 'FAILED'}: {sum(r[2] == PASS for r in rows)} passed, "
                 f"{failed} failed")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse(argv)
    configure_logging("warning", json=False)  # the workers' own warnings and errors, not every step
    gpu = torch.cuda.is_available() and not args.cpu_only
    size = Size(hidden=args.hidden or (2048 if gpu else 256), batch=args.batch or (512 if gpu else 64))
    steps = args.steps or (200 if gpu else 40)
    if gpu:
        props = torch.cuda.get_device_properties(0)
        mode = f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    else:
        why = "--cpu-only" if args.cpu_only else "torch.cuda.is_available() is False"
        mode = f"no GPU: CPU-only dry run ({why})"
    print(f"== {mode}\n== torch {torch.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs\n== {size.describe()}, {steps} steps per run", flush=True)
    work = Path(tempfile.mkdtemp(prefix="nebula-gpu-check-"))
    checker = Checker(work, size, "gpu" if gpu else "cpu", steps, args.timeout)
    t0 = time.perf_counter()
    try:
        checker.add("mode", mode, INFO)
        checker.add("model", f"{size.describe()}, {steps} steps, fp16 / int8 codecs, in_flight 2, "
                    f"Adam lr {size.lr():.2g}", INFO)
        checker.attempt("clean run", checker.clean_run)
        if "a" in checker.runs:
            if gpu:
                checker.attempt("cpu baseline", lambda: checker.cpu_baseline(args.cpu_steps))
            else:
                checker.add("steps/s on cpu vs cuda", "n/a: no GPU, the runs above are the CPU's", INFO)
            checker.attempt("identical runs", checker.identical_runs)
            checker.attempt("resume", checker.resume)
        checker.attempt("fp16 narrowing", checker.narrowing)
        checker.add("paddle on the torch path", "imported" if "paddle" in sys.modules else "not imported",
                    FAIL if "paddle" in sys.modules else PASS)
        checker.add("packages imported", third_party(), INFO)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    checker.add("wall time", f"{time.perf_counter() - t0:.0f} s", INFO)
    title = f"nebula-mq GPU check of the torch split path -- {mode}"
    report = table(title, checker.rows)
    print("\n" + report)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "gpu_check.txt"
        out.write_text(report + "\n")
        print(f"(written to {out})")
    return 1 if any(r[2] == FAIL for r in checker.rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
