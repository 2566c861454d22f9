"""Start, signal and restart the worker processes of one job on this machine.

Shared by ``nebula-mq run`` and ``nebula-mq chaos``. Each worker is a
``nebula-mq worker`` process on its own cluster's broker (settings from the
local stack), logging to ``<run_dir>/logs/<worker>.log``. ``env`` carries
``NEBULA__...`` overrides, so one job file can run as several job instances.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nebula_mq.settings import Settings, load_settings


class JobProcesses:
    def __init__(self, config: str, stack_dir: str, env: Mapping[str, str] | None = None) -> None:
        from nebula_mq.errors import StackError
        from nebula_mq.stack import DEFAULT_CLUSTERS, Stack
        from workers.plans import plan_for

        self.config = config
        self.stack_dir = stack_dir
        self.env = {**os.environ, **(env or {})}
        self.settings: Settings = load_settings(config, environ=self.env)
        self.plan = plan_for(self.settings)
        # The default clusters plus any the job's plan places workers or flows on (M3: a third).
        needed = tuple(dict.fromkeys([*DEFAULT_CLUSTERS, *(p.cluster for p in self.plan.processes),
                                      *(c for f in self.plan.flows for c in (f.src_cluster, f.dst_cluster))]))
        self.stack = Stack(stack_dir, needed)
        missing = [c for c in needed if c not in self.stack.clusters]
        if missing:  # a running stack keeps its layout
            raise StackError(f"the stack in {stack_dir} runs {list(self.stack.clusters)}, the job needs {missing} "
                             f"too: `nebula-mq stack down --run-dir {stack_dir}` first, or start it with "
                             f"`nebula-mq stack up --clusters {','.join(needed)}`")
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = self.settings.run_dir / "logs"

    @property
    def run_dir(self) -> Path:
        return self.settings.run_dir

    def provision(self) -> None:
        from nebula_mq.security.keys import ensure_job_key, job_key_file

        s = self.settings
        ensure_job_key(job_key_file(s.run_dir), s.job.id)  # before any worker starts: no race
        self.stack.up()
        self.stack.provision_job(s.job.id, self.plan.flows, self.plan.identities(s.job.id),
                                 max_queue_bytes=s.transport.max_queue_bytes)

    def start(self, worker_id: str) -> subprocess.Popen[bytes]:
        proc = next(p for p in self.plan.processes if p.worker_id == worker_id)
        self.logs.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "nebula_mq", "worker", "--role", proc.role, "--index",
               str(proc.index), "--config", self.config, "--stack", self.stack_dir]
        with open(self.logs / f"{worker_id}.log", "ab") as out:
            child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        self.children[worker_id] = child
        return child

    def start_all(self) -> None:
        for proc in self.plan.processes:
            self.start(proc.worker_id)

    def signal(self, worker_id: str, sig: signal.Signals) -> None:
        child = self.children[worker_id]
        if child.poll() is None:
            child.send_signal(sig)

    def signal_all(self, sig: signal.Signals) -> None:
        for worker_id in self.children:
            self.signal(worker_id, sig)

    def running(self) -> bool:
        return any(c.poll() is None for c in self.children.values())

    def failed(self) -> list[str]:
        return [w for w, c in self.children.items() if c.poll() not in (None, 0)]

    def wait(self, worker_id: str, timeout: float | None = None) -> int:
        return self.children[worker_id].wait(timeout)

    def steps(self) -> dict[str, int]:
        out = {}
        for proc in self.plan.processes:
            try:
                body: dict[str, Any] = json.loads(
                    (self.run_dir / "status" / f"{proc.worker_id}.json").read_text())
                out[proc.worker_id] = int(body.get("step", 0))
            except (OSError, ValueError):
                out[proc.worker_id] = 0
        return out

    def slowest_step(self) -> int:
        return min(self.steps().values(), default=0)
