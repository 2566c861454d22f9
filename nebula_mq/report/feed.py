"""The whole job as its status feed tells it, on the live report (``report --serve --feed``).

Every worker of every cluster publishes its status to the job's status feed, which federation
carries to every cluster's broker (``nebula-mq status --feed``). :class:`FeedWatch` reads the
feed on one broker every few seconds, keeps each worker's newest message and turns them into
rows (``transport.status_feed.latest``) when the page is built, so "heard N s ago" and LOST
are as of the page. :func:`feed_section` is that table. A read that fails (broker down, login
refused) is one line on the console and on the page; the rows stay as last heard.

The reader is given (``cli.status.feed_reader``): this module opens no connection itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nebula_mq.errors import DataError
from nebula_mq.report import derive
from nebula_mq.report.html_parts import e, num, table
from nebula_mq.report.parse import load_run
from nebula_mq.report.records import RunData
from nebula_mq.transport.status_feed import latest, newest

# Each read after the first goes back this much before the last good one: messages are stored
# in chunks stamped by the broker, whose clock may differ a little from this host's.
OVERLAP_S = 30.0

Reader = Callable[[float], list[dict[str, Any]]]


@dataclass(frozen=True)
class FeedView:
    """The feed as of one moment: a row per worker (``latest``), and how the reading goes."""

    cluster: str
    lost_after: float
    since_s: float
    rows: tuple[dict[str, Any], ...] = ()
    # The last read's failure, one line ("Type: message"); "" when the last read succeeded.
    error: str = ""
    # How long ago the feed was last read whole; None before the first good read.
    read_s_ago: float | None = None


def one_line(exc: BaseException) -> str:
    """``AccessRefused: host:port refused ...``: the error's type and its text on one line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")


class FeedWatch:
    """Reads ``cluster``'s feed with ``read`` (seconds back -> messages, oldest first): the last
    ``since_s`` seconds first, then since the last good read, keeping each worker's newest."""

    def __init__(self, cluster: str, read: Reader, since_s: float, lost_after: float,
                 log: Callable[[str], None] = print) -> None:
        self.cluster, self.since_s, self.lost_after = cluster, since_s, lost_after
        self._read, self._log = read, log
        self._lock = threading.Lock()
        self._newest: dict[str, dict[str, Any]] = {}
        self._read_at: float | None = None
        self._error = ""

    def poll(self) -> bool:
        """Read once; False (and the error logged once, not at every failing read) when it fails."""
        start = time.time()
        back = self.since_s if self._read_at is None else min(self.since_s, start - self._read_at + OVERLAP_S)
        try:
            messages = self._read(back)
        except Exception as exc:  # noqa: BLE001 - whatever it is, the local view goes on being served
            line = one_line(exc)
            with self._lock:
                changed, self._error = line != self._error, line
            if changed:
                self._log(f"report: cannot read {self.cluster}'s status feed: {line}")
            return False
        with self._lock:
            kept = (m for m in (*self._newest.values(), *messages) if float(m.get("sent", 0)) >= start - self.since_s)
            self._newest = newest(kept)
            recovered, self._error, self._read_at = bool(self._error), "", start
        if recovered:
            self._log(f"report: {self.cluster}'s status feed is readable again")
        return True

    def view(self, now: float | None = None) -> FeedView:
        now = time.time() if now is None else now
        with self._lock:
            rows = tuple(latest(self._newest.values(), now, self.lost_after))
            ago = None if self._read_at is None else max(0.0, now - self._read_at)
            return FeedView(self.cluster, self.lost_after, self.since_s, rows, self._error, ago)

    def run(self, stop: threading.Event, every: float, after_poll: Callable[[], None] = lambda: None) -> None:
        """Poll every ``every`` seconds until ``stop``; ``after_poll`` after each read, good or not."""
        while not stop.is_set():
            self.poll()
            after_poll()
            stop.wait(every)


# --------------------------------------------------------------------------- the page's part


COLUMNS = ("worker", "cluster", "host", "state", "step / total", "loss", "steps/s", "queued", "last checkpoint",
           "heard")


def _cells(r: dict[str, Any]) -> list[str]:
    total = f" / {num(r['total'])}" if r.get("total") is not None else ""
    queued = [q.get("messages") for q in (r.get("queues") or {}).values() if isinstance(q, dict)]
    queued_n = [q for q in queued if isinstance(q, (int, float))]
    rate = r.get("steps_per_s")
    return [f"<code>{e(str(r['worker']))}</code>", e(str(r.get("cluster") or "–")), e(str(r.get("host") or "–")),
            f'<span class="state {e(r["state"])}">{e(r["state"])}</span>',
            (num(r["step"]) if r.get("step") is not None else "–") + total,
            f"{r['loss']:.4f}" if isinstance(r.get("loss"), (int, float)) else "–",
            f"{rate:.3g}" if isinstance(rate, (int, float)) else "–",
            num(sum(queued_n)) if queued_n else "–",
            num(r["checkpoint"]) if r.get("checkpoint") is not None else "–",
            f"{derive.human_duration(max(0.0, float(r['heard_s'])))} ago"]


def feed_section(view: FeedView) -> str:
    """Every worker of every cluster as ``view.cluster``'s broker hears it, with the reading's state."""
    where = f"<b>{e(view.cluster)}</b>'s broker"
    parts = []
    if view.error:
        parts.append(f'<p class="badnote feed-error">cannot read the status feed on {where}: {e(view.error)}'
                     + (" (the rows are as last heard)" if view.rows else "") + "</p>")
    if view.read_s_ago is None and not view.error:
        parts.append(f'<p class="empty">Reading the status feed on {where}…</p>')
    elif view.read_s_ago is not None and not view.rows:
        parts.append(f'<p class="empty">No status of this job on the feed of {where} in the last '
                     f"{derive.human_duration(view.since_s)}: has it started?</p>")
    if view.rows:
        clusters = sorted({str(r.get("cluster")) for r in view.rows})
        lost = [str(r["worker"]) for r in view.rows if r["state"] == "LOST"]
        read = f", read {derive.human_duration(view.read_s_ago)} ago" if view.read_s_ago is not None else ""
        parts.append(f"<p>{len(view.rows)} worker(s) on {len(clusters)} cluster(s) ({e(', '.join(clusters))}), "
                     f"as {where} hears them{read}. A running worker silent for more than "
                     f"{view.lost_after:g} s is LOST.</p>")
        if lost:
            parts.append(f'<p class="badnote">LOST: {e(", ".join(lost))}</p>')
        parts.append(table(COLUMNS, [_cells(r) for r in view.rows], numeric=(4, 5, 6, 7, 8, 9),
                           row_class=["bad" if r["state"] in ("LOST", "failed") else "" for r in view.rows]))
    return "".join(parts)


def load_run_or_none(run_dir: str | Path) -> RunData:
    """``run_dir``'s files, or none when it is no run dir (a host that runs none of the job's
    workers, or before they start): the feed still shows the job."""
    try:
        return load_run(run_dir)
    except DataError as exc:
        return RunData(run_dir=Path(run_dir), workers={}, study=(), faults=(), bench={},
                       problems=(f"{exc}: nothing of this host's to show; the status feed above shows the job",))
