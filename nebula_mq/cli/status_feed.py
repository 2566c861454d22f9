"""``nebula-mq status JOB.toml --feed CLUSTER``: every worker of every cluster, from one broker.

Every worker publishes its status (state, step, loss, step rate, last checkpoint, its queues,
its host) every few seconds to the job's status exchange, which federation carries to every
cluster (``runtime.sampler``, ``stack.provision``). This reads the feed's stream on CLUSTER's
broker, keeps each worker's newest message, and says how long ago each was heard from; a worker
that should be running and has been silent longer than ``--lost-after`` is LOST.
``nebula-mq report --serve --feed CLUSTER`` reads it with the same options and reader.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

from nebula_mq.settings import BrokerSettings, Settings
from nebula_mq.transport.status_feed import latest, newest

__all__ = ["add_feed_options", "feed_reader", "feed_rows", "latest", "reader_broker", "table"]

# Reads the feed's messages of the last N seconds, oldest first (raises NebulaError).
FeedReader = Callable[[float], list[dict[str, Any]]]


def add_feed_options(parser: argparse.ArgumentParser, instead: str) -> None:
    """``--feed CLUSTER``, ``--lost-after SECONDS``, ``--since SECONDS``: one spelling for
    ``status`` and ``report`` (``instead``: what the feed replaces in the command's help)."""
    from nebula_mq.cli.run import positive_seconds

    parser.add_argument("--feed", metavar="CLUSTER", default="",
                        help="read the job's status feed from CLUSTER's broker: every worker of every cluster and "
                             f"host, with how long ago each was heard from ({instead})")
    parser.add_argument("--lost-after", type=positive_seconds, default=60.0, metavar="SECONDS",
                        help="with --feed: a running worker silent this long is LOST (default 60)")
    parser.add_argument("--since", type=positive_seconds, default=3600.0, metavar="SECONDS",
                        help="with --feed: read the feed's messages of the last SECONDS (default 3600)")


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


def feed_reader(settings: Settings, cluster: str, stack_dir: str) -> FeedReader:
    """The reader of the job's feed on ``cluster``'s broker (a wrong ``cluster`` is a ConfigError
    now; a broker that is down or refuses the reader, a TransportError at each read)."""
    from nebula_mq import topology
    from nebula_mq.transport.status_feed import read_status_feed

    broker = reader_broker(settings, cluster, stack_dir)
    return functools.partial(read_status_feed, broker, topology.status_stream(settings.job.id))


COLUMNS = (("worker", "worker", 14, ""), ("cluster", "cluster", 11, ""), ("host", "host", 16, ""),
           ("state", "state", 10, ""), ("step", "step", 7, "d"), ("loss", "loss", 9, ".4f"),
           ("step/s", "steps_per_s", 8, ".2f"), ("ckpt", "checkpoint", 6, "d"), ("heard", "heard_s", 8, ".1f"))


def table(rows: list[dict[str, Any]]) -> str:
    from nebula_mq.cli.table import render

    return render(COLUMNS, rows)


def feed_rows(settings: Settings, cluster: str, stack_dir: str, since_s: float, lost_after: float) -> list[dict[str, Any]]:
    return with_alarms(feed_reader(settings, cluster, stack_dir)(since_s), time.time(), lost_after)


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
