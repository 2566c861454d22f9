"""``nebula-mq status JOB.toml --feed CLUSTER``: every worker of every cluster, from one broker.

Every worker publishes its status (state, step, loss, step rate, last checkpoint, its queues,
its host) every few seconds to the job's status exchange, which federation carries to every
cluster (``runtime.sampler``, ``stack.provision``). This reads the feed's stream on CLUSTER's
broker, keeps each worker's newest message, and says how long ago each was heard from; a worker
that should be running and has been silent longer than ``--lost-after`` is LOST.
"""

from __future__ import annotations

import time
from typing import Any

from nebula_mq.settings import BrokerSettings, Settings

# The states of a worker that should still be speaking (the status file's, runtime.reporter).
LIVE = ("running", "starting", "resuming")


def reader_broker(settings: Settings, cluster: str, stack_dir: str) -> BrokerSettings:
    """How to reach ``cluster``'s broker as the job's status reader: through the local stack
    when it runs that cluster (it issues the reader's certificate), else the job file's
    ``[clusters.<cluster>.broker]`` (an operator's own identity, on a host without the stack)."""
    from nebula_mq import topology
    from nebula_mq.errors import ConfigError, NebulaError
    from nebula_mq.stack import Stack

    try:
        stack = Stack.open(stack_dir)
    except NebulaError:
        stack = None
    if stack is not None and cluster in stack.clusters:
        return stack.broker_settings(cluster, topology.status_reader(settings.job.id),
                                     vhost=topology.vhost(settings.job.id))
    if cluster not in settings.clusters:
        raise ConfigError(settings.source or "<job>", "--feed", f"a cluster of the stack in {stack_dir} "
                          f"or of the job file {sorted(settings.clusters)}", cluster)
    return settings.clusters[cluster].broker


def latest(messages: list[dict[str, Any]], now: float, lost_after: float) -> list[dict[str, Any]]:
    """One row per worker: its newest message, how long ago it was sent, and LOST when a live
    worker has been silent for more than ``lost_after`` seconds."""
    newest: dict[str, dict[str, Any]] = {}
    for m in messages:
        worker = str(m.get("worker", ""))
        if worker and float(m.get("sent", 0)) >= float(newest.get(worker, {}).get("sent", -1)):
            newest[worker] = m
    rows = []
    for worker, m in sorted(newest.items(), key=lambda kv: (str(kv[1].get("cluster")), kv[0])):
        heard = now - float(m.get("sent", now))
        state = str(m.get("state", "?"))
        values = m.get("values") or {}
        loss = next((values[k] for k in ("loss", "total_loss", "mlm_loss") if isinstance(values.get(k), (int, float))),
                    None)
        rows.append({"worker": worker, "cluster": m.get("cluster"), "host": m.get("host"), "role": m.get("role"),
                     "state": "LOST" if state in LIVE and heard > lost_after else state, "reported": state,
                     "step": m.get("step"), "total": m.get("total"), "loss": loss,
                     "steps_per_s": m.get("steps_per_s"), "checkpoint": m.get("checkpoint"),
                     "heard_s": heard, "queues": m.get("queues") or {}})
    return rows


COLUMNS = (("worker", "worker", 14, ""), ("cluster", "cluster", 11, ""), ("host", "host", 16, ""),
           ("state", "state", 10, ""), ("step", "step", 7, "d"), ("loss", "loss", 9, ".4f"),
           ("step/s", "steps_per_s", 8, ".2f"), ("ckpt", "checkpoint", 6, "d"), ("heard", "heard_s", 8, ".1f"))


def table(rows: list[dict[str, Any]]) -> str:
    from nebula_mq.cli.table import render

    return render(COLUMNS, rows)


def feed_rows(settings: Settings, cluster: str, stack_dir: str, since_s: float, lost_after: float) -> list[dict[str, Any]]:
    from nebula_mq import topology
    from nebula_mq.transport.status_feed import read_status_feed

    broker = reader_broker(settings, cluster, stack_dir)
    messages = read_status_feed(broker, topology.status_stream(settings.job.id), since_s)
    return latest(messages, time.time(), lost_after)
