"""``nebula-mq status JOB.toml``: per worker, where it is and how it is doing.

Reads the status and metrics files the workers write into the job's run dir
(no connection to a worker needed), and the queue depths from the local stack
when it is running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from nebula_mq.cli.options import add_stack_option, default_stack
from nebula_mq.cli.table import render

from nebula_mq.runtime.metrics import read_metrics

# States of a worker process that should be alive ("resuming": restored a checkpoint, no new step yet).
LIVE_STATES = ("running", "starting", "resuming")


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="show each worker's step, queues, link and compression figures")
    p.add_argument("job", help="job TOML file")
    add_stack_option(p, "the local stack's directory, for queue depths (default $NEBULA_RUN_DIR or run/stack)",
                     default_stack())
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    from nebula_mq.cli.status_feed import add_feed_options

    add_feed_options(p, "instead of this host's status files")
    p.set_defaults(func=_status)


def read_statuses(run_dir: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((run_dir / "status").glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now; the next poll reads it
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# The step value shown as "loss": ABNet and split workers record ``loss``; ELECTRA's
# discriminator ranks ``total_loss``, its generators ``mlm_loss``.
LOSS_KEYS = ("loss", "total_loss", "mlm_loss")


def _loss(values: dict[str, Any]) -> float | None:
    return next((float(values[k]) for k in LOSS_KEYS if isinstance(values.get(k), (int, float))), None)


def worker_rows(run_dir: Path, now: float | None = None) -> list[dict[str, Any]]:
    rows = []
    now = time.time() if now is None else now
    for worker, st in read_statuses(run_dir).items():
        m = read_metrics(run_dir / "metrics" / f"{worker}.prom")
        # Rates over the worker's own run: a finished or stopped worker's stop when it did.
        end = now if st.get("state") in LIVE_STATES else float(st.get("updated", now))
        elapsed = max(1e-9, end - m.get("nebula_started_timestamp", end))
        compute, wait = m.get("nebula_compute_seconds_total", 0.0), m.get("nebula_wait_seconds_total", 0.0)
        raw, wire = m.get("nebula_raw_bytes_total", 0.0), m.get("nebula_wire_bytes_total", 0.0)
        state = st.get("state", "?")
        if state in LIVE_STATES and not _alive(int(st.get("pid", 0))):
            state = "dead"
        rows.append({
            "worker": worker, "role": st.get("role"), "cluster": st.get("cluster"), "state": state,
            "step": st.get("step"), "loss": _loss(st.get("values") or {}),
            "steps_per_s": m.get("nebula_steps_total", 0.0) / elapsed,
            "wire_mbit_s": 8 * wire / elapsed / 1e6,
            "compression": (wire / raw) if raw else None,
            "compute_share": compute / (compute + wait) if compute + wait else None,
            "duplicates": m.get("nebula_duplicates_total", 0.0),
            "dead_letters": m.get("nebula_dead_letters_total", 0.0),
            # While the local broker blocks the worker's publishers (runtime.reporter): cluster, reason.
            "broker_alarm": st.get("broker_alarm"), "broker_alarm_reason": st.get("broker_alarm_reason"),
            # The end of its client certificate, and near it a warning (runtime.cert_expiry).
            "cert_expires_in_days": st.get("cert_expires_in_days"), "cert_warning": st.get("cert_warning"),
            "reason": st.get("reason"),  # why a failed worker stopped (runtime.reporter)
        })
    return rows


def _status(args: argparse.Namespace) -> int:
    from nebula_mq import topology
    from nebula_mq.errors import NebulaError
    from workers.registry import load_job_settings

    settings = load_job_settings(args.job)
    if args.feed:
        return _feed(settings, args)
    rows = worker_rows(settings.run_dir)
    queues: dict[str, Any] = {}
    try:
        from nebula_mq.stack import Stack

        stack = Stack.open(args.stack)
        for cluster in stack.clusters:
            depths = stack.queue_depths(cluster, topology.vhost(settings.job.id))
            queues[cluster] = {name: {"messages": d.messages, "bytes": d.message_bytes}
                               for name, d in depths.items()}
    except NebulaError as exc:
        queues = {"unavailable": str(exc)}
    links = local_links(args.stack, settings.job.id)
    if args.json:
        print(json.dumps({"job": settings.job.id, "workers": rows, "queues": queues, "links": links}, indent=1))
    elif rows:
        print(f"job {settings.job.id} ({settings.job.scenario}), target {settings.job.steps} steps")
        print(table(rows))
        for cluster, qs in queues.items():
            if isinstance(qs, str):
                print(f"queues: {qs}")
                continue
            for name, d in sorted(qs.items()):
                print(f"queue {cluster}/{name}: {d['messages']} messages, {d['bytes']} bytes")
        for line in [*links, *stop_reasons(rows), *broker_alarms(rows), *certificate_warnings(rows),
                     *dead_letter_alarms(queues, settings.transport.dead_letter_alarm)]:
            print(line)
    if not rows:
        for line in links:  # a link that cannot come up, whatever the workers do
            print(line)
        print(f"nebula-mq: no worker of job {settings.job.id!r} has started: no status files in "
              f"{settings.run_dir / 'status'} (start it with `nebula-mq run {args.job}`)", file=sys.stderr)
        return 1
    return 0


def _feed(settings: Any, args: argparse.Namespace) -> int:
    from nebula_mq.cli.status_feed import feed_rows, table as feed_table

    rows = feed_rows(settings, args.feed, args.stack, args.since, args.lost_after)
    links = local_links(args.stack, settings.job.id)
    if args.json:
        print(json.dumps({"job": settings.job.id, "feed": args.feed, "workers": rows, "links": links}, indent=1))
    elif rows:
        print(f"job {settings.job.id} ({settings.job.scenario}), target {settings.job.steps} steps, "
              f"as {args.feed}'s broker hears it")
        print(feed_table(rows))
        for line in links + stop_reasons(rows) + broker_alarms(rows) + certificate_warnings(rows):
            print(line)
        lost = [r["worker"] for r in rows if r["state"] == "LOST"]
        if lost:
            print(f"LOST: {', '.join(lost)}: silent for more than {args.lost_after:g} s", file=sys.stderr)
    if not rows:
        for line in links:
            print(line)
        print(f"nebula-mq: no status of job {settings.job.id!r} on {args.feed}'s feed in the last "
              f"{args.since:g} s (has it started? `nebula-mq status {args.job}` reads this host's files)",
              file=sys.stderr)
        return 1
    return 0


def local_links(stack_dir: str, job_id: str) -> list[str]:
    """The job's federation links on this host's stack, one line each (none without a stack:
    a rank host reads no broker's administration)."""
    from nebula_mq import topology
    from nebula_mq.cli.stack import link_lines
    from nebula_mq.errors import NebulaError
    from nebula_mq.stack import Stack

    try:
        return link_lines(Stack.open(stack_dir), topology.vhost(job_id))
    except NebulaError:
        return []


def stop_reasons(rows: list[dict[str, Any]]) -> list[str]:
    """A FAILED line per failed worker, with the one line that says why it stopped."""
    from nebula_mq.errors import after_name

    return [f"FAILED {r['worker']} ({r.get('cluster') or '?'}): "
            f"{after_name(r['worker'], r.get('reason') or 'no reason recorded')}"
            for r in rows if r.get("state") == "failed"]


def broker_alarms(rows: list[dict[str, Any]]) -> list[str]:
    """An ALARM line per cluster whose broker blocks the publishers of a live worker (a memory or
    disk alarm; the status files' ``broker_alarm`` and ``broker_alarm_reason``), naming them."""
    blocked: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.get("broker_alarm") and r.get("state") in (*LIVE_STATES, "LOST"):
            key = (str(r["broker_alarm"]), str(r.get("broker_alarm_reason") or "resource alarm"))
            blocked.setdefault(key, []).append(str(r["worker"]))
    return [f"ALARM {cluster}: {reason} (publishing blocked: {', '.join(sorted(workers))})"
            for (cluster, reason), workers in sorted(blocked.items())]


def certificate_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """A CERTIFICATE line per worker whose client certificate expires within ``[security]
    cert_warn_days`` or has expired (the status files' ``cert_warning``)."""
    return [f"CERTIFICATE {r['worker']}: {r['cert_warning']}" for r in rows if r.get("cert_warning")]


def dead_letter_alarms(queues: dict[str, Any], bound: int) -> list[str]:
    """An ALARM line per dead-letter queue holding more than ``bound`` messages."""
    return [f"ALARM: {cluster}/{name} holds {d['messages']} dead letters (more than [transport] "
            f"dead_letter_alarm = {bound}); each is in the job's audit log as message_dead_lettered"
            for cluster, qs in queues.items() if isinstance(qs, dict)
            for name, d in sorted(qs.items()) if name.endswith("dead-letter") and d["messages"] > bound]


# (title, row key, width, number format; "" = text, left-aligned): the header and every row.
COLUMNS = (("worker", "worker", 12, ""), ("role", "role", 20, ""), ("cluster", "cluster", 11, ""),
           ("state", "state", 10, ""), ("step", "step", 6, "d"), ("loss", "loss", 9, ".4f"),
           ("step/s", "steps_per_s", 8, ".2f"), ("Mbit/s", "wire_mbit_s", 8, ".2f"),
           ("ratio", "compression", 7, ".3f"), ("compute", "compute_share", 9, ".0%"),
           ("dups", "duplicates", 6, ".0f"), ("DLQ", "dead_letters", 5, ".0f"))


def table(rows: list[dict[str, Any]]) -> str:
    return render(COLUMNS, rows)
