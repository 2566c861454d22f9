"""The WAN control file across versions, ``Stack.link_up``, recovery grouping and the bench's flags.

No relay process runs: control files are written as the CLI does and read as the relay does
(``Relay.poll_control`` on a file, no sockets).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from nebula_mq.atomic import write_json_atomic
from nebula_mq.bench.transport_recovery import summarize
from nebula_mq.cli import main
from nebula_mq.stack import Stack
from nebula_mq.stack.layout import plan
from nebula_mq.stack.relay import Relay, Shape


def _relay(tmp_path: Path, shape: Shape | None = None) -> Relay:
    return Relay(0, "127.0.0.1", 1, tmp_path / "ctl.json", tmp_path / "status.json", shape=shape or Shape())


def test_a_relay_ignores_keys_it_does_not_know_and_applies_the_rest(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    relay = _relay(tmp_path)
    write_json_atomic(relay.control_file, {"rate_mbit": 5, "cut": True, "generation": 3, "jitter_ms": 4})
    assert relay.poll_control()
    assert relay.shape == Shape(rate_mbit=5, cut=True, generation=3)
    assert "ignoring unknown control keys ['jitter_ms']" in capsys.readouterr().err


def test_two_writes_in_one_mtime_tick_are_both_seen(tmp_path: Path) -> None:
    relay = _relay(tmp_path)
    write_json_atomic(relay.control_file, {"rate_mbit": 5, "drop": True, "generation": 1})
    os.utime(relay.control_file, ns=(10**18, 10**18))
    assert relay.poll_control() and relay.shape.drop
    write_json_atomic(relay.control_file, {"rate_mbit": 5, "generation": 2})  # the heal, same size class
    os.utime(relay.control_file, ns=(10**18, 10**18))  # ... and the same mtime: a new inode tells it
    assert relay.poll_control() and not relay.shape.drop
    assert not relay.poll_control()  # unchanged: not read again


def test_the_initial_shape_applies_at_construction(tmp_path: Path) -> None:
    assert _relay(tmp_path, Shape(drop=True))._gate.closed
    assert not _relay(tmp_path, Shape(drop=True, cut=True))._gate.closed  # a cut wins


def test_link_up_ends_every_outage_and_the_control_file_omits_a_false_drop(tmp_path: Path) -> None:
    plan(tmp_path, ("cluster-a", "cluster-b")).save()
    stack = Stack.open(tmp_path)
    stack.drop()
    stack.cut("cluster-b")
    stack.link_up(None, rate_mbit=7, delay_ms=3)
    for link in ("to-cluster-a", "to-cluster-b"):
        data = json.loads((tmp_path / "wan" / f"{link}.json").read_text())
        # A relay started before ``drop`` existed rejected the key: it is written only when True.
        assert "drop" not in data and data["cut"] is False
        assert (data["rate_mbit"], data["delay_ms"]) == (7, 3)


def _run(outage: float, measured: float) -> dict[str, Any]:
    return {"kind": "drop", "delay_ms": 20.0, "outage_s": outage, "measured_outage_s": measured,
            "heal_to_first_message_s": 0.1, "heal_to_first_outage_message_s": 0.1, "heal_to_drained_s": 0.2,
            "link_reconnects": 0, "exactly_once": True, "duplicates_discarded": 0}


def test_the_summary_groups_on_the_outage_asked_for_not_the_one_measured() -> None:
    rows = summarize([_run(2.0, 2.4), _run(2.0, 2.6), _run(0.5, 0.7), _run(1.0, 1.2)])
    assert [(r["outage_s"], r["repeats"]) for r in rows] == [(0.5, 1), (1.0, 1), (2.0, 2)]


@pytest.mark.parametrize("argv, flag", [
    (["--recovery", "--recovery-delays=-5"], "--recovery-delays"),
    (["--recovery-delays=20"], "--recovery-delays"),
    (["--outages=3"], "--outages"),
    (["--rto-max-ms=1000"], "--rto-max-ms"),
    (["--recovery", "--rto-max-ms=1000"], "--rto-max-ms"),
    (["--recovery", "--netns", "--rto-max-ms=200"], "--rto-max-ms"),
    (["--recovery", "--netns"], "--stack"),
    (["--recovery", "--compare-pika"], "--compare-pika"),
])
def test_bench_transport_refuses_flags_out_of_place_in_one_line(argv: list[str], flag: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "transport", "--stack", "/nonexistent", *argv]) == 1  # before any stack starts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"nebula-mq: error: bench transport: {flag}: expected")
