"""Progress: a bar on a terminal, a plain line now and then everywhere else."""

from __future__ import annotations

import fcntl
import io
import os
import select
import struct
import termios

import pytest

from nebula_mq.runtime.progress import progress


def test_off_a_terminal_a_line_at_most_every_interval() -> None:
    stream = io.StringIO()
    with progress(total=40, desc="training", stream=stream, unit="step", every_s=0.0) as bar:
        bar.set_postfix(loss=3.21)
        for _ in range(4):
            bar.update(10)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in stream.getvalue()
    assert lines[0].startswith("training: 10/40 (25%), ") and " step/s, ETA " in lines[0] and lines[0].endswith("loss=3.21")
    assert lines[-1].startswith("training: 40/40 (100%)")


def test_the_phase_joins_the_line_off_a_terminal() -> None:
    stream = io.StringIO()
    with progress(total=10, desc="training", stream=stream, every_s=0.0) as bar:
        bar.set_phase("evaluating 24 sentences: encoding and sending them")
        bar.update(10)
    assert stream.getvalue().rstrip().endswith(", evaluating 24 sentences: encoding and sending them")


def test_no_output_off_a_terminal_within_the_first_interval() -> None:
    stream = io.StringIO()
    with progress(total=50, desc="train", stream=stream) as bar:
        for _ in range(50):
            bar.update()
        bar.set_postfix(loss=0.5)
    assert stream.getvalue() == "" and bar.n == 50 and not bar.shown


def test_default_stream_is_stderr_and_stays_silent_under_capture(capsys: object) -> None:
    with progress(total=3, desc="prepare") as bar:
        bar.update(3)
    out = capsys.readouterr()  # type: ignore[attr-defined]
    assert out.err == "" and out.out == "" and bar.n == 3


def _drain(fd: int) -> bytes:
    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("columns", [100, 0])  # 0: a pty whose size was never set
def test_a_bar_is_drawn_on_a_terminal(columns: int) -> None:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, columns, 0, 0))
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            assert tty.isatty()
            with progress(total=7, desc="study chains", stream=tty, unit="chain") as bar:
                for _ in range(7):
                    bar.update()
                bar.set_postfix(bleu=21.5)
            tty.flush()
        shown = _drain(master).decode(errors="replace")
    finally:
        os.close(master)
        os.close(slave)
    assert bar.shown and bar.n == 7
    assert "study chains" in shown and "7/7" in shown and "chain" in shown


def test_unknown_total_counts_without_a_bar_length() -> None:
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            with progress(total=None, desc="scan", stream=tty) as bar:
                bar.update(5)
                bar.update(2)
            tty.flush()
        shown = _drain(master).decode(errors="replace")
    finally:
        os.close(master)
        os.close(slave)
    assert bar.total is None and bar.n == 7 and "scan" in shown and "7" in shown
