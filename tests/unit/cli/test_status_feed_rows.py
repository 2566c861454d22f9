"""The feed's view (``transport.status_feed.latest``): each worker's newest message, how long ago it was
heard, and LOST for a worker that should be running but has been silent too long."""

from __future__ import annotations

from nebula_mq.cli.status import FEED_COLUMNS, table
from nebula_mq.transport.status_feed import latest


def msg(worker: str, sent: float, state: str = "running", step: int = 1, cluster: str = "cluster-a") -> dict:
    return {"worker": worker, "cluster": cluster, "host": "h1", "role": "split-head", "state": state,
            "step": step, "total": 10, "values": {"loss": 0.5}, "steps_per_s": 2.0, "checkpoint": None,
            "sent": sent, "queues": {}}


def test_the_newest_message_of_each_worker_wins_whatever_the_order() -> None:
    rows = latest([msg("a", 50.0, step=5), msg("a", 40.0, step=4), msg("b", 45.0, cluster="cluster-b")],
                  now=60.0, lost_after=30.0)
    assert [(r["worker"], r["step"], r["heard_s"]) for r in rows] == [("a", 5, 10.0), ("b", 1, 15.0)]
    assert all(r["state"] == "running" for r in rows)


def test_a_live_worker_silent_too_long_is_lost_but_a_finished_one_is_not() -> None:
    rows = {r["worker"]: r for r in latest([msg("a", 0.0), msg("b", 0.0, state="finished"),
                                            msg("c", 95.0)], now=100.0, lost_after=60.0)}
    assert rows["a"]["state"] == "LOST" and rows["a"]["reported"] == "running"
    assert rows["b"]["state"] == "finished" and rows["c"]["state"] == "running"
    text = table(list(rows.values()), FEED_COLUMNS)
    assert text.splitlines()[0].startswith("worker") and "LOST" in text and "100.0" in text


def test_messages_that_are_not_a_workers_are_ignored() -> None:
    assert latest([{"state": "running"}, {"worker": ""}], now=1.0, lost_after=1.0) == []


def test_a_message_without_a_finite_send_time_is_skipped_not_fatal() -> None:
    """Anything on the stream that is not one of ours (a sent time of text, NaN, true) is passed
    over; the workers' own messages still make their rows."""
    odd = [{**msg("a", 0.0), "sent": bad} for bad in ("yesterday", float("nan"), True, None)]
    rows = latest([*odd, msg("b", 9.0)], now=10.0, lost_after=60.0)
    assert [(r["worker"], r["heard_s"]) for r in rows] == [("b", 1.0)]
