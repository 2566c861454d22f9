"""Why a worker stopped, read back from its JSON-lines log (``nebula_mq.launch.logpipe.exit_reason``):
written through the real log pipe by real processes, then read as the supervisor reads it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from nebula_mq.launch.logpipe import exit_reason


def _through_logpipe(tmp_path: Path, code: str, env: dict[str, str] | None = None) -> tuple[Path, int, int]:
    """Run ``code`` in a Python process whose stdout and stderr go through the launcher's log
    pipe into a log that already holds an earlier run's error; (log, where this run began, rc)."""
    import os

    log = tmp_path / "w.log"
    earlier = {"event": "error", "error": "ConfigError", "message": "an earlier run's mistake",
               "restart_helps": False}
    log.write_text(json.dumps(earlier) + "\n")
    since = log.stat().st_size
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pipe = subprocess.Popen([sys.executable, "-m", "nebula_mq.launch.logpipe", str(log), "w", str(out_r),
                             str(err_r)], pass_fds=(out_r, err_r))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=out_w, stderr=err_w,
                             env={**os.environ, **(env or {})})
    for fd in (out_r, out_w, err_r, err_w):
        os.close(fd)
    rc = child.wait(60)
    pipe.wait(30)
    return log, since, rc


def test_a_typed_error_is_its_message_and_says_whether_a_restart_helps(tmp_path: Path) -> None:
    code = ("import sys; from nebula_mq.cli import main; "
            "sys.exit(main(['worker', 'no/such/job.toml', '--role', 'split-tail']))")
    log, since, rc = _through_logpipe(tmp_path, code, {"NEBULA_JSON_ERRORS": "1"})
    reason = exit_reason(log, since, rc)
    assert rc == 1 and "no/such/job.toml" in reason.text and "earlier" not in reason.text
    assert reason.restart_helps is False  # a missing job file stays missing


def test_a_crash_is_the_last_line_of_its_traceback(tmp_path: Path) -> None:
    code = "def f():\n    raise RuntimeError('CUDA error: an illegal memory access')\ntry:\n  f()\n" \
           "except RuntimeError as e:\n  raise ValueError('while stepping') from e"
    log, since, rc = _through_logpipe(tmp_path, code)
    reason = exit_reason(log, since, rc)
    assert rc == 1 and reason.text == "ValueError: while stepping" and reason.restart_helps


def test_an_unexpected_error_under_the_launcher_ends_with_its_record_and_keeps_the_trace(tmp_path: Path) -> None:
    code = ("import sys\nfrom unittest import mock\nfrom nebula_mq import cli\n"
            "with mock.patch.object(cli, '_parser_for', side_effect=KeyError('lost')):\n"
            "    sys.exit(cli.main(['status', 'x.toml']))")
    log, since, rc = _through_logpipe(tmp_path, code, {"NEBULA_JSON_ERRORS": "1"})
    reason = exit_reason(log, since, rc)
    assert rc == 1 and reason.text == "KeyError: 'lost'" and reason.restart_helps
    assert "Traceback (most recent call last):" in log.read_text()


def test_a_kill_leaves_no_words_and_is_named_by_its_signal(tmp_path: Path) -> None:
    log, since, rc = _through_logpipe(tmp_path, "import os, signal; print('working'); os.kill(os.getpid(), 9)")
    assert rc == -signal.SIGKILL
    assert exit_reason(log, since, rc).text == "killed by SIGKILL"
    assert exit_reason(log, since, 3).text == "exited 3 without saying why"
