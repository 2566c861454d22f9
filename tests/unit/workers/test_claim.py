"""One process per rank, on its own host (``workers.claim``): real locks, real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nebula_mq.errors import PlacementError
from nebula_mq.settings import JobSettings, Settings
from workers.claim import CLAIM_FD_ENV, claim_path, claim_rank
from workers.processes import Process

ROOT = Path(__file__).resolve().parents[3]
TAIL = Process("split-tail", "cluster-b", "tail-0")

# A second process claiming the rank: prints "held" or the refusal's line.
CLAIMANT = """
import sys
from pathlib import Path
from nebula_mq.errors import PlacementError
from nebula_mq.settings import JobSettings, Settings
from workers.claim import claim_rank
from workers.processes import Process
settings = Settings(job=JobSettings(id="claims", run_dir=sys.argv[1]), source="job.toml")
try:
    claim_rank(settings, Process("split-tail", "cluster-b", "tail-0"), "a test's second process")
    print("held")
except PlacementError as exc:
    print(exc)
"""


def _settings(tmp_path: Path) -> Settings:
    return Settings(job=JobSettings(id="claims", run_dir=str(tmp_path)), source="job.toml")


def _claimant(tmp_path: Path, **kw: object) -> str:
    return subprocess.run([sys.executable, "-c", CLAIMANT, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, **kw).stdout.strip()  # type: ignore[call-overload]


def test_a_rank_that_runs_already_is_refused_in_one_line_naming_who_holds_it(tmp_path: Path) -> None:
    held = claim_rank(_settings(tmp_path), TAIL, "nebula-mq up")
    refusal = _claimant(tmp_path)
    assert refusal.startswith("tail-0 (cluster-b) of job claims is already running (nebula-mq up (pid "
                              f"{os.getpid()}) on "), refusal
    assert "refused, nothing touched" in refusal and "\n" not in refusal
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["tail-0.lock"]  # nothing else
    held.release()
    assert _claimant(tmp_path) == "held"  # released with its holder


def test_a_worker_started_by_its_launcher_holds_the_launchers_claim_and_keeps_it(tmp_path: Path) -> None:
    held = claim_rank(_settings(tmp_path), TAIL, "nebula-mq run")
    given = _claimant(tmp_path, env={**os.environ, CLAIM_FD_ENV: str(held.fd)}, pass_fds=(held.fd,))
    assert given == "held"
    assert "already running" in _claimant(tmp_path)  # anyone else is still refused
    assert json.loads(claim_path(_settings(tmp_path), TAIL).read_text())["holder"] == "nebula-mq run"
    held.release()


@pytest.mark.parametrize("host,words", [
    ("192.0.2.7", r"^tail-0 \(cluster-b\) is placed on 192\.0\.2\.7 \(192\.0\.2\.7\) by job\.toml, which is "
                  r"not this host"),
    ("no-such-host.invalid", r"^tail-0 is placed on 'no-such-host\.invalid' by job\.toml: cannot resolve"),
])
def test_a_rank_on_a_host_the_job_does_not_place_it_on_is_refused_before_its_claim(
        tmp_path: Path, host: str, words: str) -> None:
    with pytest.raises(PlacementError, match=words):
        claim_rank(_settings(tmp_path), Process("split-tail", "cluster-b", "tail-0", host=host), "test")
    assert not (tmp_path / "claims").exists()
    claim_rank(_settings(tmp_path), Process("split-tail", "cluster-b", "tail-0", host="127.0.0.1"), "test").release()
