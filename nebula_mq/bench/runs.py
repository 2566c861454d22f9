"""What the benches that run on a local stack share: the stack (started if down, its WAN links put
back as they were), a job file run as one row of real worker processes with ``NEBULA__``
overrides, and what a row's run directory says (step history, metrics, wire bytes)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import signal
import statistics
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nebula_mq.stack import Shape, Stack


# --------------------------------------------------------------------------- command line and machine


def add_stack_arguments(parser: argparse.ArgumentParser, stack_help: str) -> None:
    """``--stack`` (the local stack the rows run on) and ``--timeout`` (seconds per row)."""
    parser.add_argument("--stack", "--run-dir", dest="stack", metavar="DIR",
                        default=os.environ.get("NEBULA_RUN_DIR", "run/stack"), help=stack_help)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per row")


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it, else what ``platform.processor`` says."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            return next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        return cpu


def numbers(text: str, flag: str, allow_zero: bool = False) -> list[float]:
    """``10,60`` as numbers; anything else is a one-line ConfigError naming ``flag``."""
    from nebula_mq.errors import ConfigError

    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError("<command line>", flag, "numbers separated by commas, like 10,60", text) from None
    if not values or any(v < 0 or (v == 0 and not allow_zero) for v in values):
        raise ConfigError("<command line>", flag, "positive numbers separated by commas, like 10,60", text)
    return values


def check_repeats(repeats: int) -> int:
    """``--repeats``: a whole number >= 1, else a one-line ConfigError."""
    if repeats < 1:
        from nebula_mq.errors import ConfigError

        raise ConfigError("<command line>", "--repeats", "a whole number >= 1", repeats)
    return repeats


def write_json(path: str | None, result: Any) -> None:
    """``--json-out``: the result as JSON at ``path`` (nothing without one)."""
    if path:
        Path(path).write_text(json.dumps(result, indent=2))


# --------------------------------------------------------------------------- the stack


def link_shapes(stack: Stack) -> dict[str, Shape]:
    """Each WAN link's shape, by the cluster it leads to."""
    return {cluster: status.shape for cluster, status in stack.status().items()}


def put_back(stack: Stack, before: dict[str, Shape]) -> None:
    """Each link as it was (``link_shapes``)."""
    for cluster, shape in before.items():
        stack.shape(cluster, rate_mbit=shape.rate_mbit, delay_ms=shape.delay_ms, cut=shape.cut, drop=shape.drop)


@contextlib.contextmanager
def bench_stack(run_dir: str | None) -> Iterator[tuple[Stack, bool]]:
    """The stack at ``run_dir`` (started if down, left as found, its WAN's shape restored), or a
    fresh one on free ports, removed afterwards; and whether it was started here."""
    from nebula_mq.stack import Stack, layout, node

    tmp = None if run_dir else tempfile.mkdtemp(prefix="nebula-bench-", dir="/tmp")
    if run_dir and layout.StackLayout.load(run_dir) is not None:
        stack = Stack.open(run_dir)
    else:
        stack = Stack(run_dir or tmp, layout.DEFAULT_CLUSTERS,
                      base_port=layout.free_base_port(len(layout.DEFAULT_CLUSTERS), os.getpid()),
                      prefix=f"nbb{os.getpid()}")
    started = not all(node.is_running(n) for n in stack.layout.nodes)
    before = link_shapes(stack)
    try:
        if started:
            print(f"starting a stack in {stack.layout.run_dir} ...")
            stack.up()
        yield stack, started
    finally:
        try:
            put_back(stack, before)  # the WAN as we found it
        finally:  # a stack started here goes down even when its WAN could not be restored
            try:
                if started:
                    stack.down()
            finally:
                if tmp:
                    shutil.rmtree(tmp, ignore_errors=True)


def delete_vhosts(stack: Stack, job_ids: Iterable[str]) -> None:
    """Remove the jobs' vhosts from every cluster; one that fails (or was never made) is said, not raised,
    so the next is still removed and the bench's own error is the one that shows."""
    from nebula_mq import topology
    from nebula_mq.errors import NebulaError

    for cluster, job_id in itertools.product(stack.clusters, job_ids):
        try:
            stack.rabbitmqctl(cluster, "delete_vhost", topology.vhost(job_id))
        except NebulaError as exc:
            print(f"cleanup: {cluster}: vhost of {job_id} not deleted: {exc}")


# --------------------------------------------------------------------------- job rows


@contextlib.contextmanager
def rows_dir(name: str) -> Iterator[Path]:
    """A temporary directory for the rows' run directories: removed when every row finished,
    unless ``NEBULA_KEEP_BENCH`` is set; a failed row's logs stay for its error."""
    root = Path(tempfile.mkdtemp(prefix=f"nebula-bench-{name}-", dir="/tmp"))
    yield root
    if not os.environ.get("NEBULA_KEEP_BENCH"):
        shutil.rmtree(root, ignore_errors=True)


def row_overrides(job_id: str, run_dir: Path, steps: int | None = None) -> dict[str, str]:
    """``NEBULA__`` overrides that make a job file one row: its own id and run_dir (and steps)."""
    env = {"NEBULA__JOB__ID": job_id, "NEBULA__JOB__RUN_DIR": str(run_dir)}
    if steps is not None:
        env["NEBULA__JOB__STEPS"] = str(steps)
    return env


def run_row(config: str, stack_dir: str, env: dict[str, str], timeout: float) -> Any:
    """The job file ``config`` with ``env``'s overrides, provisioned and run to its end as
    ``nebula-mq run`` runs it (each worker with its share of the cores); its ``JobProcesses``."""
    from nebula_mq.errors import WorkerError
    from nebula_mq.launch import JobProcesses

    job = JobProcesses(config, stack_dir, env=env)
    job.provision()
    try:
        job.start_all()
        codes = job.wait_all(timeout)
    finally:
        job.signal_all(signal.SIGKILL)  # a row stopped while its workers start leaves none behind
    if any(codes.values()):
        raise WorkerError(f"job {job.settings.job.id} did not finish ({codes}): see the logs in {job.logs}")
    return job


def job_settings(config: str, scenarios: tuple[str, ...], expected: str) -> Any:
    """The settings of a job file of one of ``scenarios``; another scenario is a one-line
    ConfigError saying what the bench ``expected``."""
    from nebula_mq.errors import ConfigError
    from workers.registry import load_job_settings

    settings = load_job_settings(config)
    if settings.job.scenario not in scenarios:
        raise ConfigError(config, "job.scenario", expected, settings.job.scenario)
    return settings


def split_job(config: str) -> Any:
    """The settings of a split or ABNet job file (a job with a head and a tail)."""
    return job_settings(config, ("abnet", "split"), "abnet or split (a job with a head and a tail)")


# --------------------------------------------------------------------------- a row's run directory


def history(run_dir: Path, worker: str) -> list[dict[str, Any]]:
    """``worker``'s step history, a row a step."""
    return [json.loads(line) for line in (run_dir / "history" / f"{worker}.jsonl").read_text().splitlines()]


def compute_wait(run_dir: Path) -> dict[str, tuple[float, float]]:
    """Each worker's seconds computing and seconds waiting (for the other side's messages)."""
    from nebula_mq.runtime.metrics import read_metrics

    out = {}
    for prom in sorted((run_dir / "metrics").glob("*.prom")):
        m = read_metrics(prom)
        out[prom.stem] = (m.get("nebula_compute_seconds_total", 0.0), m.get("nebula_wait_seconds_total", 0.0))
    return out


def published_bytes(run_dir: Path, worker: str = "*") -> float:
    """Every byte the job's workers (or one ``worker``) published (wire bytes, direction out)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for prom in (run_dir / "metrics").glob(f"{worker}.prom"):
        for family in text_string_to_metric_families(prom.read_text()):
            total += sum(s.value for s in family.samples
                         if s.name == "nebula_wire_bytes_total" and s.labels.get("direction") == "out")
    return total


def sides(plan: Any) -> tuple[list[str], list[str]]:
    """The workers that publish activations (heads, encoders: every rank) and those that publish
    gradients (tails, decoders): each side's messages cross the WAN in one direction."""
    roles = [(p.worker_id, p.role) for p in plan.processes]
    return ([w for w, role in roles if role.endswith(("head", "encoder"))],
            [w for w, role in roles if role.endswith(("tail", "decoder"))])


def measure(run_dir: Path, head: str, warmup: int,
            by_side: tuple[list[str], list[str]] = ([], [])) -> dict[str, Any]:
    """Samples/s after the warm-up (from ``head``'s step history), wire bytes, the median step
    and the final loss; with ``by_side`` (``sides(plan)``) also each side's bytes a step (head, tail) and
    the busier direction's."""
    rows = history(run_dir, head)
    t = [r["time"] for r in rows]
    w = min(warmup, len(t) - 2)
    batch = rows[-1]["samples"]
    samples = batch * len(rows)
    by_side_bytes = [sum(published_bytes(run_dir, worker) for worker in side) / len(rows) for side in by_side]
    return {"samples_per_s": batch * (len(t) - 1 - w) / (t[-1] - t[w]), "samples": samples,
            "bytes_per_sample": published_bytes(run_dir) / samples, "final_loss": rows[-1]["loss"],
            "busiest_bytes_per_step": max(by_side_bytes), "bytes_per_step_by_side": by_side_bytes,
            "step_s_median": statistics.median(b - a for a, b in zip(t[w:], t[w + 1:]))}
