"""``wan drop``/``heal`` on a stack's control files, the status line, and the recovery summary.

No relay runs here: a control file is written and read as the relay would (the relay's own
behaviour under a drop is measured on real sockets in tests/integration/test_stack_relay.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nebula_mq.bench.transport_recovery import summarize
from nebula_mq.cli import main
from nebula_mq.cli.stack import status_lines
from nebula_mq.stack.layout import plan


def _control(tmp_path: Path, link: str) -> dict[str, Any]:
    return dict(json.loads((tmp_path / "wan" / f"{link}.json").read_text()))


def test_drop_then_heal_writes_the_control_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan(tmp_path, ("cluster-a", "cluster-b")).save()
    assert main(["wan", "drop", "cluster-a", "--run-dir", str(tmp_path)]) == 0
    assert _control(tmp_path, "to-cluster-a")["drop"] is True
    assert not (tmp_path / "wan" / "to-cluster-b.json").exists()  # only the link named
    assert main(["wan", "cut", "--run-dir", str(tmp_path)]) == 0
    assert main(["wan", "heal", "--run-dir", str(tmp_path)]) == 0  # heal ends a cut and a drop alike
    for link in ("to-cluster-a", "to-cluster-b"):
        shape = _control(tmp_path, link)
        assert shape.get("drop", False) is False and shape["cut"] is False  # written only when True
    assert "relay not running" in capsys.readouterr().out


def test_a_cluster_given_twice_must_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan(tmp_path, ("cluster-a", "cluster-b")).save()
    assert main(["wan", "drop", "cluster-a", "--to", "cluster-b", "--run-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["nebula-mq: error: wan drop: CLUSTER 'cluster-a' and --to 'cluster-b' disagree; give one"]
    assert not (tmp_path / "wan" / "to-cluster-a.json").exists()


def test_status_line_says_drop() -> None:
    shape: dict[str, Any] = {"rate_mbit": 60, "delay_ms": 200, "drop": True, "cut": False}
    st = {"shape": shape, "connections": 2, "counters": {"up": 10, "down": 20}, "time": 0}
    assert status_lines({"to-cluster-a": st})[1].split()[:2] == ["to-cluster-a", "DROP"]
    shape["cut"] = True  # a cut wins, as in the relay
    assert status_lines({"to-cluster-a": st})[1].split()[1] == "CUT"


def _run(kind: str, first: float | None, reconnects: int = 0) -> dict[str, Any]:
    return {"kind": kind, "delay_ms": 200.0, "outage_s": 5.0, "measured_outage_s": 5.03,
            "heal_to_first_message_s": first, "heal_to_first_outage_message_s": first, "heal_to_drained_s": None if first is None else first + 1,
            "link_reconnects": reconnects, "exactly_once": first is not None, "duplicates_discarded": 0}


def test_summary_takes_medians_per_kind_and_a_run_that_never_recovered_shows() -> None:
    rows = summarize([_run("drop", 0.3), _run("reset", 4.5, 3), _run("drop", 0.2), _run("reset", 4.4, 3),
                      _run("drop", 0.25), _run("reset", None, 3)])
    assert [(r["kind"], r["outage_s"], r["repeats"]) for r in rows] == [("reset", 5, 3), ("drop", 5, 3)]
    reset, drop = rows
    assert drop["first_message_s"] == 0.25 and drop["first_message_rtts"] == pytest.approx(0.625)
    assert drop["drained_s"] == 1.25 and drop["exactly_once"] and drop["link_reconnects"] == [0, 0, 0]
    assert reset["first_message_s"] is None and not reset["exactly_once"]  # not hidden by a median
