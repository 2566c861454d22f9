"""Read a job's run directory into plain frozen records.

Every file is optional: a run that has not finished, or a scenario without a
study or chaos faults, still gets a report. A file that exists but cannot be
read is not fatal either: :func:`load_run` records it in ``RunData.problems``
so the page says what it could not show instead of silently leaving it out.
The single-file readers (``read_*``) raise :class:`DataError` on bad input so
they can be tested and reused on their own.

Layout (written by ``nebula_mq.runtime.worker`` and ``metrics``, and by the
study, chaos and bench producers)::

    history/<worker>.jsonl     one JSON object per step: step, time, values
    metrics/<worker>.prom      Prometheus text exposition of MetricsHook
    status/<worker>.json       worker, role, cluster, job, pid, state, step, updated, values
    checkpoints/<worker>/step-NNNNNNNNN/meta.json
    study/*.json               compression study rows (chain, bleu, ratios, s_per_step)
    faults.jsonl               {time, kind, target, recovered_after_s}
    bench/*.json               benchmark results (any JSON)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from nebula_mq.errors import DataError
from nebula_mq.report.records import Fault, RunData, WorkerMetrics, WorkerRun, WorkerStatus
from nebula_mq.runtime.metrics import IDENTITY

# Same rule as CheckpointStore.steps: a step directory counts once its meta.json exists.
_STEP_DIR = re.compile(r"^step-(\d{9})$")


# --------------------------------------------------------------------------- single files


def read_prometheus(text: str, source: str) -> WorkerMetrics:
    """Parse a MetricsHook textfile (Prometheus text format 0.0.4)."""
    scalars: dict[str, float] = {}
    by_flow_dir: dict[str, dict[tuple[str, str], float]] = {}
    by_flow: dict[str, dict[str, float]] = {}
    dead: dict[tuple[str, str], float] = {}
    values: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # noqa: BLE001 - the parser raises ValueError, IndexError, ...
        raise DataError(f"{source}: not Prometheus text format: {exc}") from None
    for family in families:
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name in ("nebula_raw_bytes_total", "nebula_wire_bytes_total", "nebula_messages_total"):
                key = (labels.get("flow", ""), labels.get("direction", ""))
                by_flow_dir.setdefault(name, {})[key] = value
            elif name in ("nebula_redeliveries_total", "nebula_duplicates_total"):
                by_flow.setdefault(name, {})[labels.get("flow", "")] = value
            elif name == "nebula_queue_messages":
                by_flow.setdefault(name, {})[labels.get("queue", labels.get("flow", ""))] = value
            elif name == "nebula_dead_letters_total":
                dead[(labels.get("flow", ""), labels.get("reason", ""))] = value
            elif name == "nebula_value":
                values[labels.get("name", "")] = value
            elif set(labels) <= set(IDENTITY):  # the worker's own labels only: one per file
                scalars[name] = value
    if "nebula_steps_total" not in scalars:
        raise DataError(f"{source}: no nebula_steps_total sample; not a nebula-mq worker metrics file")
    return WorkerMetrics(
        steps=scalars["nebula_steps_total"],
        raw_bytes=by_flow_dir.get("nebula_raw_bytes_total", {}),
        wire_bytes=by_flow_dir.get("nebula_wire_bytes_total", {}),
        messages=by_flow_dir.get("nebula_messages_total", {}),
        redeliveries=by_flow.get("nebula_redeliveries_total", {}),
        duplicates=by_flow.get("nebula_duplicates_total", {}),
        dead_letters=dead,
        compute_s=scalars.get("nebula_compute_seconds_total", 0.0),
        wait_s=scalars.get("nebula_wait_seconds_total", 0.0),
        queue_messages=by_flow.get("nebula_queue_messages", {}),
        values=values,
        started=scalars.get("nebula_started_timestamp"),
    )


def read_history(text: str, source: str) -> tuple[tuple[Mapping[str, float], ...], list[str]]:
    """Rows by step (last occurrence wins) and notes on lines that were skipped.

    A worker killed mid-write leaves a truncated last line; that loses one row,
    not the whole curve, so bad lines are skipped and reported rather than fatal.
    """
    rows: dict[int, dict[str, float]] = {}
    skipped: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            row = {k: float(v) for k, v in obj.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
            step, when = row["step"], row["time"]
        except (ValueError, KeyError, AttributeError, TypeError):
            skipped.append(f"{source}:{number}: not a history row (needs JSON with numeric step and time)")
            continue
        if not (math.isfinite(step) and math.isfinite(when)):
            skipped.append(f"{source}:{number}: non-finite step or time")
            continue
        rows[int(step)] = row
    if not rows and not skipped:
        return (), []
    if not rows:
        raise DataError(f"{source}: no readable history rows ({skipped[0]})")
    return tuple(rows[s] for s in sorted(rows)), skipped


def read_status(text: str, source: str) -> WorkerStatus:
    try:
        obj = json.loads(text)
        values = obj.get("values") or {}
        return WorkerStatus(
            worker=str(obj["worker"]), role=str(obj.get("role", "?")),
            cluster=str(obj.get("cluster", "?")), job=str(obj.get("job", "?")),
            pid=int(obj.get("pid", 0)), state=str(obj.get("state", "unknown")),
            step=int(obj.get("step", 0)), updated=float(obj.get("updated", 0.0)),
            values={str(k): float(v) for k, v in values.items()},
        )
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        raise DataError(f"{source}: not a worker status file ({type(exc).__name__}: {exc})") from None


def read_faults(text: str, source: str) -> tuple[Fault, ...]:
    faults = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            rec = obj.get("recovered_after_s")
            faults.append(Fault(time=float(obj["time"]), kind=str(obj["kind"]),
                                target=str(obj.get("target", "")),
                                recovered_after_s=None if rec is None else float(rec)))
        except (ValueError, KeyError, AttributeError, TypeError):
            raise DataError(f"{source}:{number}: not a fault record "
                            "(needs time, kind, target, recovered_after_s)") from None
    return tuple(sorted(faults, key=lambda f: f.time))


def read_study(text: str, source: str) -> tuple[Mapping[str, Any], ...]:
    """A study file holds one row, a list of rows, or ``{"rows": [...]}``."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise DataError(f"{source}: not JSON: {exc}") from None
    rows = obj.get("rows", obj) if isinstance(obj, dict) else obj
    rows = [rows] if isinstance(rows, dict) else rows
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "chain" in r for r in rows):
        raise DataError(f"{source}: expected study rows (objects with a 'chain' key)")
    return tuple(rows)


def checkpoint_steps(directory: Path) -> tuple[int, ...]:
    if not directory.is_dir():
        return ()
    steps = [int(m.group(1)) for e in directory.iterdir()
             if (m := _STEP_DIR.match(e.name)) and (e / "meta.json").exists()]
    return tuple(sorted(steps))


# --------------------------------------------------------------------------- the run


def load_run(run_dir: str | Path) -> RunData:
    """Everything the report shows, from ``run_dir``. Raises DataError if it is no run dir."""
    root = Path(run_dir)
    if not root.is_dir():
        raise DataError(f"{root}: no such run directory")
    known = ("history", "metrics", "status", "checkpoints", "study", "bench", "faults.jsonl")
    if not any((root / name).exists() for name in known):
        raise DataError(f"{root}: not a job run directory (none of {', '.join(known)} found)")
    problems: list[str] = []

    def each(sub: str, pattern: str) -> dict[str, Path]:
        folder = root / sub
        suffix = pattern.lstrip("*")
        return {p.name.removesuffix(suffix): p for p in sorted(folder.glob(pattern))} if folder.is_dir() else {}

    def guarded(path: Path, reader: Any) -> Any:
        try:
            return reader(path.read_text(encoding="utf-8", errors="replace"), str(path.relative_to(root)))
        except DataError as exc:
            problems.append(str(exc))
            return None
        except OSError as exc:
            problems.append(f"{path.relative_to(root)}: unreadable ({exc.strerror})")
            return None

    histories, metrics, statuses = each("history", "*.jsonl"), each("metrics", "*.prom"), each("status", "*.json")
    ckpt_root = root / "checkpoints"
    ckpt_ids = {p.name for p in ckpt_root.iterdir() if p.is_dir()} if ckpt_root.is_dir() else set()
    workers: dict[str, WorkerRun] = {}
    for wid in sorted(set(histories) | set(metrics) | set(statuses) | ckpt_ids):
        history: tuple[Mapping[str, float], ...] = ()
        if wid in histories:
            got = guarded(histories[wid], read_history)
            if got is not None:
                history, skipped = got
                problems.extend(skipped)
        workers[wid] = WorkerRun(
            worker_id=wid,
            status=guarded(statuses[wid], read_status) if wid in statuses else None,
            history=history,
            metrics=guarded(metrics[wid], read_prometheus) if wid in metrics else None,
            checkpoints=checkpoint_steps(ckpt_root / wid),
        )

    study: list[Mapping[str, Any]] = []
    for path in each("study", "*.json").values():
        study.extend(guarded(path, read_study) or ())
    faults: tuple[Fault, ...] = ()
    if (root / "faults.jsonl").is_file():
        faults = guarded(root / "faults.jsonl", read_faults) or ()
    bench: dict[str, Any] = {}
    for stem, path in each("bench", "*.json").items():
        doc = guarded(path, _read_json)
        if doc is not None:
            bench[stem] = doc
    evaluation = guarded(root / "eval.json", _read_json) if (root / "eval.json").is_file() else None
    depths: list[tuple[float, str, float, float]] = []
    for path in each("queues", "*.jsonl").values():
        depths.extend(guarded(path, read_queue_depths) or ())
    return RunData(run_dir=root, workers=workers, study=tuple(study), faults=faults,
                   bench=bench, problems=tuple(problems),
                   evaluation=evaluation if isinstance(evaluation, Mapping) else None,
                   queue_depths=tuple(sorted(depths)))


def read_queue_depths(text: str, source: str) -> list[tuple[float, str, float, float]]:
    """A worker's queue samples (``queues/<worker>.jsonl``); a torn last line is skipped."""
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
            rows.append((float(row["time"]), str(row["queue"]), float(row["messages"]),
                         float(row.get("bytes", "nan"))))
        except (ValueError, KeyError, TypeError):
            continue
    if text.strip() and not rows:
        raise DataError(f"{source}: no queue samples")
    return rows


def _read_json(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise DataError(f"{source}: not JSON: {exc}") from None
