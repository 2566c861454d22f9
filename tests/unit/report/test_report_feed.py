"""The status feed on the report page (``report --serve --feed``), no broker: the messages are the
ones real workers' reporters and queue samplers publish; only the reading of the stream is given."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from nebula_mq.cli import main as cli_main
from nebula_mq.errors import AccessRefused, ConnectionLost, DataError
from nebula_mq.report.feed import OVERLAP_S, FeedWatch
from nebula_mq.report.render import build_report
from nebula_mq.runtime.reporter import Reporter
from nebula_mq.runtime.sampler import QueueSampler
from nebula_mq.settings import JobSettings, Settings
from nebula_mq.transport.probe import QueueProbe


class CapturingProbe(QueueProbe):
    """Every queue holds 3 messages; published status messages are kept (no broker)."""

    def __init__(self) -> None:
        self.published: list[bytes] = []

    def queue_depth(self, queue: str) -> int | None:
        return 3

    def publish_status(self, exchange: str, key: str, body: bytes) -> None:
        self.published.append(body)

    def close(self) -> None:
        pass


def published(run_dir: Path, worker: str, cluster: str, steps: int, state: str, checkpoint: int | None) -> dict[str, Any]:
    """The status message a worker's sampler publishes after ``steps`` steps and then ``state``."""
    settings = Settings(job=JobSettings(id="feed-page", scenario="split", steps=30, run_dir=str(run_dir)))
    reporter = Reporter(settings, cluster, worker, f"split-{worker.split('-')[0]}")
    for step in range(1, steps + 1):
        if checkpoint is not None and step == checkpoint + 1:
            reporter.checkpoint = checkpoint  # as Worker.save sets it; the next status says so
        reporter.record(step, {"loss": 1.0 / step})
    reporter.checkpoint = checkpoint
    if state != "running":
        reporter.status(state)
    probe = CapturingProbe()
    sampler = QueueSampler(probe, lambda: [f"q-{worker}"], "dead-letter", reporter.metrics, run_dir / "queues" / f"{worker}.jsonl",
                           lambda n: None, status=lambda: dict(reporter.last), status_exchange="nebula.feed-page.status")
    assert sampler.sample()
    return dict(json.loads(probe.published[-1]))


@pytest.fixture
def messages(tmp_path: Path) -> list[dict[str, Any]]:
    # head-0's files are on this host; tail-0 runs on the other cluster (only the feed knows it).
    head = published(tmp_path / "run", "head-0", "cluster-a", 30, "finished", 30)
    tail = published(tmp_path / "elsewhere", "tail-0", "cluster-b", 12, "running", 10)
    return [head, tail]


def page_of(run_dir: Path, out: Path, watch: FeedWatch, now: float) -> str:
    return build_report(run_dir, out, refresh_s=2, feed=watch.view(now)).read_text()


def feed_rows(html: str) -> dict[str, list[str]]:
    """The feed table's rows as the page shows them: worker -> cell texts."""
    section = html.split('<section id="feed">', 1)[1].split("</section>", 1)[0]
    rows = {}
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", section)[1:]:
        cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
        rows[cells[0]] = cells
    return rows


def test_the_page_lists_every_worker_of_the_feed_beside_the_local_view(tmp_path: Path,
                                                                       messages: list[dict[str, Any]]) -> None:
    watch = FeedWatch("cluster-b", lambda since: messages, since_s=3600, lost_after=60, log=lambda line: None)
    assert watch.poll()
    sent = max(float(m["sent"]) for m in messages)
    html = page_of(tmp_path / "run", tmp_path / "out", watch, now=sent + 5)
    rows = feed_rows(html)
    host = socket.gethostname()
    assert rows["head-0"][:5] == ["head-0", "cluster-a", host, "finished", "30 / 30"]
    assert rows["tail-0"][:5] == ["tail-0", "cluster-b", host, "running", "12 / 30"]
    assert rows["head-0"][5] == "0.0333" and rows["tail-0"][5] == "0.0833"  # loss of the last step
    assert rows["head-0"][7] == rows["tail-0"][7] == "6"  # 3 in its queue, 3 in the dead-letter queue
    assert rows["head-0"][8] == "30" and rows["tail-0"][8] == "10"  # last checkpoint
    assert rows["tail-0"][6] != "–" and rows["tail-0"][9].endswith(" s ago")  # step rate, heard
    assert "2 worker(s) on 2 cluster(s) (cluster-a, cluster-b)" in html and "LOST:" not in html
    assert html.index('id="feed"') < html.index('id="summary"')  # the whole job first, then this host's
    assert "<code>head-0</code>" in html.split('<section id="summary">', 1)[1]  # the local view is still there
    assert 'http-equiv="refresh" content="2"' in html

    # Silent for longer than --lost-after: the running worker is LOST, the finished one is not.
    later = feed_rows(page_of(tmp_path / "run", tmp_path / "out", watch, now=sent + 61))
    assert later["tail-0"][3] == "LOST" and later["head-0"][3] == "finished"
    assert later["tail-0"][9] == "61.0 s ago"


def test_a_failing_reader_is_one_line_on_the_page_and_console_and_the_rows_stay(
        tmp_path: Path, messages: list[dict[str, Any]]) -> None:
    outcomes: list[Any] = [AccessRefused("127.0.0.1:5671 refused the login\nof this certificate"),
                           AccessRefused("127.0.0.1:5671 refused the login\nof this certificate"),
                           messages, ConnectionLost("connect to 127.0.0.1:5671: Connection refused")]

    def read(since_s: float) -> list[dict[str, Any]]:
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return list(out)

    logged: list[str] = []
    watch = FeedWatch("cluster-b", read, since_s=3600, lost_after=60, log=logged.append)
    html = page_of(tmp_path / "run", tmp_path / "out", watch, now=0)
    assert "Reading the status feed on <b>cluster-b</b>" in html and "feed-error" not in html
    assert not watch.poll() and not watch.poll()
    html = page_of(tmp_path / "run", tmp_path / "out", watch, now=0)
    assert ('cannot read the status feed on <b>cluster-b</b>\'s broker: AccessRefused: 127.0.0.1:5671 refused '
            "the login of this certificate</p>") in html
    assert feed_rows(html) == {} and "<code>head-0</code>" in html  # the local view goes on
    assert watch.poll() and not watch.poll()
    html = page_of(tmp_path / "run", tmp_path / "out", watch, now=max(float(m["sent"]) for m in messages))
    assert set(feed_rows(html)) == {"head-0", "tail-0"} and "(the rows are as last heard)" in html
    assert "ConnectionLost: connect to 127.0.0.1:5671: Connection refused" in html and "Traceback" not in html
    assert logged == [  # once per new error, not at every failing read
        "report: cannot read cluster-b's status feed: AccessRefused: 127.0.0.1:5671 refused the login of this "
        "certificate", "report: cluster-b's status feed is readable again",
        "report: cannot read cluster-b's status feed: ConnectionLost: connect to 127.0.0.1:5671: Connection refused"]


def test_later_reads_go_back_only_to_the_last_good_one_and_forget_what_is_older_than_since(
        messages: list[dict[str, Any]]) -> None:
    asked: list[float] = []
    batches = [[{**messages[0], "sent": 0.0}, messages[1]], []]

    def read(since_s: float) -> list[dict[str, Any]]:
        asked.append(since_s)
        return batches.pop(0)

    watch = FeedWatch("cluster-a", read, since_s=600, lost_after=60, log=lambda line: None)
    assert watch.poll() and watch.poll()
    assert asked[0] == 600 and OVERLAP_S <= asked[1] < OVERLAP_S + 5
    assert [r["worker"] for r in watch.view().rows] == ["tail-0"]  # head-0's message is from 1970


def test_without_local_files_the_feed_alone_makes_the_page(tmp_path: Path, messages: list[dict[str, Any]]) -> None:
    with pytest.raises(DataError, match="no such run directory"):
        build_report(tmp_path / "nowhere", tmp_path / "out")
    watch = FeedWatch("cluster-a", lambda since: messages, since_s=3600, lost_after=60, log=lambda line: None)
    watch.poll()
    html = build_report(tmp_path / "nowhere", tmp_path / "out", feed=watch.view()).read_text()
    assert set(feed_rows(html)) == {"head-0", "tail-0"} and "no such run directory" in html


JOB = """
[job]
id = "feed-cli"
scenario = "split"
steps = 30
run_dir = "{run_dir}"

[clusters.far.broker]
host = "127.0.0.1"
port = 1
tls = false
"""


def test_cli_feed_needs_the_job_file_and_a_known_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    published(tmp_path / "run", "head-0", "cluster-a", 3, "running", None)
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(run_dir=tmp_path / "run"))
    assert cli_main(["report", str(tmp_path / "run"), "--feed", "far"]) == 1
    assert "expected the job file with --feed" in capsys.readouterr().err
    assert cli_main(["report", str(job), "--feed", "near", "--stack", str(tmp_path / "no-stack")]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--feed: expected a cluster of the stack" in err and "'near'" in err
    # A job file without --feed: its run dir, as today; with it, one reading (here a refused one) on the page.
    assert cli_main(["report", str(job), "--out", str(tmp_path / "a")]) == 0
    assert 'id="feed"' not in (tmp_path / "a" / "report.html").read_text()
    assert cli_main(["report", str(job), "--out", str(tmp_path / "b"), "--feed", "far",
                     "--stack", str(tmp_path / "no-stack")]) == 0
    out = capsys.readouterr().out
    assert "report: cannot read far's status feed: " in out and "Traceback" not in out
    assert "feed-error" in (tmp_path / "b" / "report.html").read_text()
