"""Workers started at the same moment in one run dir agree on one job key."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from nebula_mq.security.auth import load_message_auth
from nebula_mq.settings import JobSettings, Settings


def _key_id(run_dir: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    auth = load_message_auth(Settings(job=JobSettings(id="keys", run_dir=run_dir)), "w")
    out.put(auth.ring.current.key_id)


def test_concurrent_first_starts_create_one_key(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_key_id, args=(str(tmp_path), out)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 6
    assert len({out.get(timeout=5) for _ in procs}) == 1
