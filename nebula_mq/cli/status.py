"""``nebula-mq status JOB.toml``: per worker, where it is and how it is doing.

Reads the status and metrics files the workers write into the job's run dir
(no connection to a worker needed), and the queue depths from the local stack
when it is running.

``--feed CLUSTER``: every worker of every cluster, from one broker. Every worker publishes its
status (state, step, loss, step rate, last checkpoint, its queues, its host) every few seconds
to the job's status exchange, which federation carries to every cluster (``runtime.sampler``,
``stack.provision``). This reads the feed's stream on CLUSTER's broker, keeps each worker's
newest message, and says how long ago each was heard from; a worker that should be running and
has been silent longer than ``--lost-after`` is LOST. ``nebula-mq report --serve --feed
CLUSTER`` reads it with the same options and reader.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nebula_mq.cli.options import add_stack_option, default_stack, positive_seconds
from nebula_mq.runtime.metrics import read_metrics
from nebula_mq.settings import Settings
from nebula_mq.transport.status_feed import LIVE, LOSS_KEYS, latest, newest

# Reads the feed's messages of the last N seconds, oldest first (raises NebulaError).
FeedReader = Callable[[float], list[dict[str, Any]]]


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="show each worker's step, queues, link and compression figures")
    p.add_argument("job", help="job TOML file")
    add_stack_option(p, "the local stack's directory, for queue depths (default $NEBULA_RUN_DIR or run/stack)",
                     default_stack())
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_feed_options(p, "instead of this host's status files")
    p.set_defaults(func=_status)


def add_feed_options(parser: argparse.ArgumentParser, instead: str) -> None:
    """``--feed CLUSTER``, ``--lost-after SECONDS``, ``--since SECONDS``: one spelling for
    ``status`` and ``report`` (``instead``: what the feed replaces in the command's help)."""
    parser.add_argument("--feed", metavar="CLUSTER", default="",
                        help="read the job's status feed from CLUSTER's broker: every worker of every cluster and "
                             f"host, with how long ago each was heard from ({instead})")
    parser.add_argument("--lost-after", type=positive_seconds, default=60.0, metavar="SECONDS",
                        help="with --feed: a running worker silent this long is LOST (default 60)")
    parser.add_argument("--since", type=positive_seconds, default=3600.0, metavar="SECONDS",
                        help="with --feed: read the feed's messages of the last SECONDS (default 3600)")


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


def worker_rows(run_dir: Path, now: float | None = None) -> list[dict[str, Any]]:
    rows = []
    now = time.time() if now is None else now
    for worker, st in read_statuses(run_dir).items():
        m = read_metrics(run_dir / "metrics" / f"{worker}.prom")
        # Rates over the worker's own run: a finished or stopped worker's stop when it did.
        end = now if st.get("state") in LIVE else float(st.get("updated", now))
        elapsed = max(1e-9, end - m.get("nebula_started_timestamp", end))
        compute, wait = m.get("nebula_compute_seconds_total", 0.0), m.get("nebula_wait_seconds_total", 0.0)
        raw, wire = m.get("nebula_raw_bytes_total", 0.0), m.get("nebula_wire_bytes_total", 0.0)
        state = st.get("state", "?")
        if state in LIVE and not _alive(int(st.get("pid", 0))):
            state = "dead"
        values = st.get("values") or {}
        rows.append({
            "worker": worker, "role": st.get("role"), "cluster": st.get("cluster"), "state": state,
            "step": st.get("step"),
            "loss": next((float(values[k]) for k in LOSS_KEYS if isinstance(values.get(k), (int, float))), None),
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


def feed_reader(settings: Settings, cluster: str, stack_dir: str) -> FeedReader:
    """The reader of the job's feed on ``cluster``'s broker, reached as the job's status reader:
    through the local stack when it runs that cluster (it issues the reader's certificate), else
    the job file's ``[clusters.<cluster>.broker]`` (an operator's own identity, on a host without
    the stack). A wrong ``cluster`` is a ConfigError now; a broker that is down or refuses the
    reader, a TransportError at each read."""
    from nebula_mq import topology
    from nebula_mq.errors import ConfigError, NebulaError
    from nebula_mq.stack import Stack
    from nebula_mq.transport.status_feed import read_status_feed

    try:
        stack = Stack.open(stack_dir)
    except NebulaError:
        stack = None
    if stack is not None and cluster in stack.clusters:
        broker = stack.broker_settings(cluster, topology.status_reader(settings.job.id),
                                       vhost=topology.vhost(settings.job.id))
    elif cluster in settings.clusters:
        broker = settings.clusters[cluster].broker
    else:
        raise ConfigError(settings.source or "<job>", "--feed", f"a cluster of the stack in {stack_dir} "
                          f"or of the job file {sorted(settings.clusters)}", cluster)
    return functools.partial(read_status_feed, broker, topology.status_stream(settings.job.id))


# What a row takes from its worker's newest message besides ``latest``'s columns: the broker's
# alarm (set while the worker's local broker blocks its publishers), the client certificate's
# end (``runtime.cert_expiry``) and why a failed worker stopped, so the feed raises the ALARM,
# CERTIFICATE and FAILED lines the status files do.
ALARM_FIELDS = ("broker_alarm", "broker_alarm_reason", "cert_expires_in_days", "cert_warning", "reason")


def with_alarms(messages: list[dict[str, Any]], now: float, lost_after: float) -> list[dict[str, Any]]:
    """``latest``'s rows, each with its newest message's :data:`ALARM_FIELDS`."""
    last = newest(messages)
    rows = latest(messages, now, lost_after)
    for row in rows:
        m = last.get(row["worker"], {})
        row.update({k: m.get(k) for k in ALARM_FIELDS})
    return rows


def _status(args: argparse.Namespace) -> int:
    from workers.registry import load_job_settings

    settings = load_job_settings(args.job)
    job = settings.job
    queues: dict[str, Any] = {}  # none from the feed
    if args.feed:
        rows = with_alarms(feed_reader(settings, args.feed, args.stack)(args.since), time.time(), args.lost_after)
        body: dict[str, Any] = {"job": job.id, "feed": args.feed, "workers": rows}
    else:
        rows, queues = worker_rows(settings.run_dir), queue_depths(args.stack, job.id)
        body = {"job": job.id, "workers": rows, "queues": queues}
    links = local_links(args.stack, job.id)
    if args.json:
        print(json.dumps({**body, "links": links}, indent=1))
    elif rows:
        print(f"job {job.id} ({job.scenario}), target {job.steps} steps"
              + (f", as {args.feed}'s broker hears it" if args.feed else ""))
        print(table(rows, FEED_COLUMNS if args.feed else COLUMNS))
        for cluster, qs in queues.items():
            if isinstance(qs, str):
                print(f"queues: {qs}")
                continue
            for name, d in sorted(qs.items()):
                print(f"queue {cluster}/{name}: {d['messages']} messages, {d['bytes']} bytes")
        for line in [*links, *stop_reasons(rows), *broker_alarms(rows), *certificate_warnings(rows),
                     *dead_letter_alarms(queues, settings.transport.dead_letter_alarm)]:
            print(line)
        lost = [r["worker"] for r in rows if r["state"] == "LOST"]
        if lost:
            print(f"LOST: {', '.join(lost)}: silent for more than {args.lost_after:g} s", file=sys.stderr)
    if rows:
        return 0
    for line in links:  # a link that cannot come up, whatever the workers do
        print(line)
    if args.feed:
        print(f"nebula-mq: no status of job {job.id!r} on {args.feed}'s feed in the last "
              f"{args.since:g} s (has it started? `nebula-mq status {args.job}` reads this host's files)",
              file=sys.stderr)
    else:
        print(f"nebula-mq: no worker of job {job.id!r} has started: no status files in "
              f"{settings.run_dir / 'status'} (start it with `nebula-mq run {args.job}`)", file=sys.stderr)
    return 1


def queue_depths(stack_dir: str, job_id: str) -> dict[str, Any]:
    """Cluster -> the job's queue -> its messages and bytes on this host's stack, or
    ``{"unavailable": why}`` where the stack cannot say."""
    from nebula_mq import topology
    from nebula_mq.errors import NebulaError
    from nebula_mq.stack import Stack

    try:
        stack = Stack.open(stack_dir)
        return {cluster: {name: {"messages": d.messages, "bytes": d.message_bytes}
                          for name, d in stack.queue_depths(cluster, topology.vhost(job_id)).items()}
                for cluster in stack.clusters}
    except NebulaError as exc:
        return {"unavailable": str(exc)}


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
        if r.get("broker_alarm") and r.get("state") in (*LIVE, "LOST"):
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


# (title, row key, width, number format; "" = text, left-aligned): the header and every row, of
# this host's status files and of the feed.
Column = tuple[str, str, int, str]
COLUMNS: tuple[Column, ...] = (
    ("worker", "worker", 12, ""), ("role", "role", 20, ""), ("cluster", "cluster", 11, ""),
    ("state", "state", 10, ""), ("step", "step", 6, "d"), ("loss", "loss", 9, ".4f"),
    ("step/s", "steps_per_s", 8, ".2f"), ("Mbit/s", "wire_mbit_s", 8, ".2f"),
    ("ratio", "compression", 7, ".3f"), ("compute", "compute_share", 9, ".0%"),
    ("dups", "duplicates", 6, ".0f"), ("DLQ", "dead_letters", 5, ".0f"))
FEED_COLUMNS: tuple[Column, ...] = (
    ("worker", "worker", 14, ""), ("cluster", "cluster", 11, ""), ("host", "host", 16, ""),
    ("state", "state", 10, ""), ("step", "step", 7, "d"), ("loss", "loss", 9, ".4f"),
    ("step/s", "steps_per_s", 8, ".2f"), ("ckpt", "checkpoint", 6, "d"), ("heard", "heard_s", 8, ".1f"))


def _cell(v: Any, width: int, fmt: str) -> str:
    """Text left-aligned; a number right-aligned; a missing number a dash as wide (a missing
    value never shifts the columns after it)."""
    if not fmt:
        return f"{v!s:<{width}}"
    if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
        return f"{v:>{width}{fmt}}"
    return "-".rjust(width)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column] = COLUMNS) -> str:
    """The header and one line per row."""
    header = "".join(f"{title:<{w}}" if not fmt else f"{title:>{w}}" for title, _, w, fmt in columns)
    return "\n".join([header, *("".join(_cell(r[key], w, fmt) for _, key, w, fmt in columns) for r in rows)])
