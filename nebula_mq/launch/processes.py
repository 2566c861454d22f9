"""Start, signal and restart the worker processes of one job on this machine.

Shared by ``nebula-mq run`` and ``nebula-mq chaos``. Each worker is a
``nebula-mq worker`` process on its own cluster's broker (settings from the
local stack), logging to ``<run_dir>/logs/<worker>.log``. ``env`` carries
``NEBULA__...`` overrides, so one job file can run as several job instances.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from signal import Signals
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nebula_mq.atomic import write_atomic
from nebula_mq.errors import after_name
from nebula_mq.runtime.logs import JSON_ERRORS_ENV
from nebula_mq.runtime.signals import stop_signals_held
from nebula_mq.settings import Settings
from workers.claim import CLAIM_FD_ENV, Claim, claim_rank

if TYPE_CHECKING:
    from nebula_mq.config import EnvOverride
    from nebula_mq.launch.logpipe import ExitReason
    from workers.processes import Process

# How long an exited worker's log pipe gets to write what was left in the pipe.
LOG_DRAIN_S = 10.0


class JobProcesses:
    def __init__(self, config: str, stack_dir: str, env: Mapping[str, str] | None = None,
                 metrics_port_base: int = 0, select: Callable[[Process], bool] | None = None,
                 broker_host: str = "", command_name: str = "run") -> None:
        """``metrics_port_base``: serve worker ``i``'s metrics on that port + ``i`` (0: none);
        ``select``: the processes of the plan this machine runs (default: all of them, on a
        stack that holds every cluster the job uses); ``broker_host``: the workers reach the
        stack's broker by this name from its certificate (another host of the cluster), not on
        loopback; ``command_name``: the command this launcher runs for (``run``, ``up``), as
        the claim of each rank names its holder."""
        from nebula_mq.errors import StackError
        from nebula_mq.stack import DEFAULT_CLUSTERS, Stack
        from workers.plans import plan_for
        from workers.registry import load_job_settings

        self.config = config
        self.stack_dir = stack_dir
        self.env = {**os.environ, **(env or {})}
        self.settings: Settings = load_job_settings(config, environ=self.env)
        self.plan = plan_for(self.settings)
        self.processes = [p for p in self.plan.processes if select is None or select(p)]
        if select is None:
            # The default clusters plus any the job's plan places workers or flows on (M3: a third).
            needed = tuple(dict.fromkeys([*DEFAULT_CLUSTERS, *(p.cluster for p in self.plan.processes),
                                          *(c for f in self.plan.flows for c in (f.src_cluster, f.dst_cluster))]))
        else:  # this host's part: the clusters of its own workers
            needed = tuple(dict.fromkeys(p.cluster for p in self.processes))
        self.stack = Stack(stack_dir, needed)
        missing = [c for c in needed if c not in self.stack.clusters]
        if missing:  # a running stack keeps its layout
            raise StackError(self._unknown_clusters(missing, needed))
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        # Each worker's log pipe (``launch.logpipe``), the process that writes its log file.
        self.log_pipes: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = self.settings.run_dir / "logs"
        # Where each worker's log ended when it last started: what it wrote since is its own.
        self.log_starts: dict[str, int] = {}
        self.metrics_port_base = metrics_port_base
        self.broker_host = broker_host
        self.claims: dict[str, Claim] = {}
        self.command_name = command_name
        self.epochs = GroupEpochs(self.run_dir, {p.restart_group for p in self.processes if p.restart_group})

    def _unknown_clusters(self, missing: list[str], needed: tuple[str, ...]) -> str:
        """Most often a typo in the job: say which key names it and the closest known cluster;
        a job that really spans more clusters needs the stack restarted with them."""
        from nebula_mq.config import env_overrides
        from nebula_mq.stack.layout import did_you_mean

        known = self.stack.clusters
        overrides = env_overrides(self.env)
        names = "; ".join(f"{name!r} in {_where_named(self.settings, name, overrides)}"
                          f"{did_you_mean(name, known)}" for name in missing)
        return (f"unknown cluster {names}: the stack in {self.stack_dir} has {', '.join(known)}. "
                f"If the job really runs on more clusters, restart the stack with them: "
                f"`nebula-mq stack down --stack {self.stack_dir}`, then "
                f"`nebula-mq stack up --stack {self.stack_dir} --clusters {','.join(needed)}`")

    @property
    def run_dir(self) -> Path:
        return self.settings.run_dir

    def provision(self) -> None:
        import getpass

        from nebula_mq.security.audit import AuditLog
        from nebula_mq.security.keys import ensure_job_key, job_key_file

        s = self.settings
        ensure_job_key(job_key_file(s.run_dir), s.job.id)  # before any worker starts: no race
        self.stack.up()
        self.stack.provision_job(s.job.id, self.plan.flows, self.plan.identities(s.job.id),
                                 max_queue_bytes=s.transport.max_queue_bytes)
        AuditLog(s.run_dir / "audit" / "audit.jsonl").record(
            "job_submitted", job=s.job.id, scenario=s.job.scenario, config=str(Path(self.config).resolve()),
            actor=getpass.getuser(), steps=s.job.steps, workers=[p.worker_id for p in self.plan.processes])

    def metrics_ports(self) -> dict[str, int]:
        """Worker id -> the port its metrics are served on (empty without a base port)."""
        if not self.metrics_port_base:
            return {}
        return {p.worker_id: self.metrics_port_base + i for i, p in enumerate(self.processes)}

    def command(self, worker_id: str) -> list[str]:
        proc = next(p for p in self.processes if p.worker_id == worker_id)
        cmd = [sys.executable, "-m", "nebula_mq", "worker", self.config, "--role", proc.role, "--index",
               str(proc.index), "--stack", self.stack_dir]
        if self.broker_host:
            cmd += ["--broker-host", self.broker_host]
        port = self.metrics_ports().get(worker_id)
        return cmd + ["--metrics-port", str(port)] if port else cmd

    def claim(self, worker_id: str) -> Claim:
        """This launcher's hold on ``worker_id``'s rank (``workers.claim``), taken once and kept
        across the worker's restarts: a rank placed on another host, or running already, is a
        one-line ``PlacementError`` before anything of it is touched."""
        if worker_id not in self.claims:
            proc = next(p for p in self.processes if p.worker_id == worker_id)
            self.claims[worker_id] = claim_rank(self.settings, proc, f"nebula-mq {self.command_name}")
        return self.claims[worker_id]

    def start(self, worker_id: str) -> subprocess.Popen[bytes]:
        """Start ``worker_id``; its stdout and stderr go through a log pipe (``launch.logpipe``)
        into ``<run_dir>/logs/<worker>.log``, so every line of that file is a JSON object. The
        worker inherits its rank's claim (:meth:`claim`)."""
        claim = self.claim(worker_id)
        self.logs.mkdir(parents=True, exist_ok=True)
        cmd = self.command(worker_id)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            # The worker starts with SIGINT/SIGTERM held until its own handlers are in
            # (runtime.signals): a stop while it imports paddle is a clean stop, not a fatal error.
            # The log pipe ignores them: it ends when the worker's end of the pipes closes.
            with open(self.log_of(worker_id), "ab") as log, stop_signals_held():
                self.log_starts[worker_id] = log.seek(0, os.SEEK_END)
                pipe = subprocess.Popen(
                    [sys.executable, "-m", "nebula_mq.launch.logpipe", str(log.name), worker_id, str(out_r),
                     str(err_r)], stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(out_r, err_r))
                self.log_pipes[worker_id] = pipe
                child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                                         env={**self.worker_env(), CLAIM_FD_ENV: str(claim.fd)},
                                         pass_fds=(claim.fd,))
                # Recorded before the held signals are let through: a stop that lands as they
                # are (SystemExit, KeyboardInterrupt) still finds this worker to kill.
                self.children[worker_id] = child
        finally:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
        return child

    def worker_env(self) -> dict[str, str]:
        """Each worker's share of the cores (unless the user set it): the workers of a
        local run would otherwise each start a thread per core and oversubscribe them.
        A worker prints a typed error as a JSON line (``runtime.logs.JSON_ERRORS_ENV``)."""
        from nebula_mq.models.cpu import thread_share_env

        return {**thread_share_env(len(self.processes)), **self.env, JSON_ERRORS_ENV: "1"}

    def drain_logs(self, worker_id: str | None = None, timeout: float = LOG_DRAIN_S) -> None:
        """Wait until the log pipes of exited workers (``worker_id``'s, or all) have written
        everything, at most ``timeout`` seconds in all. A pipe still held open by something
        the worker started keeps running and ends with it."""
        deadline = time.monotonic() + timeout
        for worker, pipe in list(self.log_pipes.items()):
            child = self.children.get(worker)
            if worker_id not in (None, worker) or (child is not None and child.poll() is None):
                continue
            try:
                pipe.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                continue
            if self.log_pipes.get(worker) is pipe:
                del self.log_pipes[worker]

    def log_of(self, worker_id: str) -> Path:
        return self.logs / f"{worker_id}.log"

    def named(self, worker_id: str) -> str:
        """``worker_id`` as a user finds it: with its cluster, ``tail-0 (cluster-b)``."""
        proc = next(p for p in self.processes if p.worker_id == worker_id)
        return f"{worker_id} ({proc.cluster})"

    def exit_reason(self, worker_id: str) -> ExitReason:
        """Why ``worker_id`` stopped, from what its log says since it last started, once its
        log pipe has written the rest (``launch.logpipe.exit_reason``)."""
        # Imported here: the package must not import the module its log pipes run as ``python -m``.
        from nebula_mq.launch.logpipe import exit_reason

        code = self.children[worker_id].poll()
        self.drain_logs(worker_id, timeout=2.0)
        reason = exit_reason(self.log_of(worker_id), self.log_starts.get(worker_id, 0), code)
        return dataclasses.replace(reason, text=after_name(worker_id, reason.text))  # shown after ``named``

    def release_claims(self) -> None:
        """Let go of every rank this launcher holds: its workers have exited for good."""
        for claim in self.claims.values():
            claim.release()
        self.claims.clear()

    def claim_all(self) -> None:
        """Claim every rank this host runs (:meth:`claim`): one refused, none is started."""
        for proc in self.processes:
            self.claim(proc.worker_id)

    def start_all(self) -> None:
        self.claim_all()
        for proc in self.processes:
            self.start(proc.worker_id)

    def group_of(self, worker_id: str) -> tuple[str, ...]:
        """``worker_id`` and the processes that must stop and start with it (its gloo group)."""
        proc = next(p for p in self.processes if p.worker_id == worker_id)
        if not proc.restart_group:
            return (worker_id,)
        return tuple(p.worker_id for p in self.processes if p.restart_group == proc.restart_group)

    def kill_and_restart(self, worker_id: str, pause_s: float = 0.0, *, tell_others: bool = True) -> tuple[str, ...]:
        """SIGKILL ``worker_id`` and its group, wait ``pause_s``, start them all again; the
        supervisors of the group's ranks on other hosts restart theirs too (:class:`GroupEpochs`)."""
        members = self.group_of(worker_id)
        for member in members:
            self.signal(member, signal.SIGKILL)
        for member in members:
            self.wait(member)
        group = next(p.restart_group for p in self.processes if p.worker_id == worker_id)
        if group and tell_others:
            self.epochs.bump(group)
        time.sleep(pause_s)
        for member in members:
            self.start(member)
        return members

    def follow_group_restarts(self, pause_s: float = 1.0) -> list[str]:
        """Restart this host's ranks of every group another host's supervisor restarted since
        the last call; the workers restarted."""
        restarted: list[str] = []
        for group in self.epochs.moved():
            first = next(p.worker_id for p in self.processes if p.restart_group == group)
            restarted += self.kill_and_restart(first, pause_s, tell_others=False)
        return restarted

    def signal(self, worker_id: str, sig: Signals) -> None:
        child = self.children[worker_id]
        if child.poll() is None:
            child.send_signal(sig)

    def signal_all(self, sig: Signals) -> None:
        for worker_id in self.children:
            self.signal(worker_id, sig)

    def running(self) -> bool:
        return any(c.poll() is None for c in self.children.values())

    def failed(self) -> list[str]:
        return [w for w, c in self.children.items() if c.poll() not in (None, 0)]

    def wait_all(self, timeout: float) -> dict[str, int]:
        """Wait for every worker to exit, at most ``timeout`` seconds; the first failure ends the
        wait (its peers would only sit out their own timeouts). Whatever still runs is killed.
        Returns each worker's exit code. Interrupted (Ctrl-C, a SIGTERM that unwinds), it kills
        the workers before it lets the interruption through: none outlives its caller."""
        deadline = time.monotonic() + timeout
        try:
            while self.running() and not self.failed() and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            self.signal_all(signal.SIGKILL)
        codes = {w: c.wait(10) for w, c in self.children.items()}
        self.drain_logs()
        self.release_claims()
        return codes

    def wait(self, worker_id: str, timeout: float | None = None) -> int:
        """``worker_id``'s exit code, once it has exited and its log pipe has written the rest."""
        code = self.children[worker_id].wait(timeout)
        self.drain_logs(worker_id)
        return code

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Each worker's status file (empty for one not written yet)."""
        out: dict[str, dict[str, Any]] = {}
        for proc in self.processes:
            try:
                out[proc.worker_id] = json.loads((self.run_dir / "status" / f"{proc.worker_id}.json").read_text())
            except (OSError, ValueError):
                out[proc.worker_id] = {}
        return out

    # The readers below take one snapshot of the status files (``statuses``), so a caller
    # polling several figures reads the files once; without it they read them afresh.

    def steps(self, statuses: dict[str, dict[str, Any]] | None = None) -> dict[str, int]:
        return {w: int(body.get("step", 0)) for w, body in (statuses or self.statuses()).items()}

    def phase(self, statuses: dict[str, dict[str, Any]] | None = None) -> str:
        """What a worker says it is doing besides training steps (e.g. "evaluating ..."), if any."""
        for body in (statuses or self.statuses()).values():
            if body.get("state") == "running" and body.get("phase"):
                return str(body["phase"])
        return ""

    def loss(self, statuses: dict[str, dict[str, Any]] | None = None) -> float | None:
        """The latest loss a worker reports (the first that has one: ELECTRA's total_loss)."""
        for body in (statuses or self.statuses()).values():
            values = body.get("values") or {}
            for key in ("loss", "total_loss"):
                if isinstance(values.get(key), (int, float)):
                    return float(values[key])
        return None

    def stall_lines(self, statuses: dict[str, dict[str, Any]] | None = None) -> list[str]:
        """Why no step is being made, as far as this host can tell: whom each worker says it
        waits for (or what it is doing instead: starting, evaluating), and each federation link
        of the job on this host's brokers that is down."""
        from nebula_mq import topology
        from nebula_mq.errors import NebulaError

        lines = []
        for w, body in (statuses or self.statuses()).items():
            if body.get("waiting_for"):
                lines.append(f"{self.named(w)} waits for {body['waiting_for']}")
            elif body.get("phase"):
                lines.append(f"{self.named(w)} is {body['phase']}")
            elif body.get("state") in ("starting", "resuming") or not body:
                lines.append(f"{self.named(w)} is {body.get('state', 'starting')} (step {body.get('step', 0)})")
        for cluster, node in self.stack.status().items():
            if not node.running:
                continue  # another host's broker (a rank host's view of a shared stack directory)
            try:
                links = self.stack.federation_links(cluster, topology.vhost(self.settings.job.id))
            except NebulaError as exc:
                lines.append(f"links of {cluster}: cannot read them ({exc})")
                continue
            lines += [link.line() for link in links if not link.up]
        return lines

    def slowest_step(self, statuses: dict[str, dict[str, Any]] | None = None) -> int:
        return min(self.steps(statuses).values(), default=0)


class GroupEpochs:
    """The restart epochs of a job's groups, as this supervisor last saw them.

    A gloo group whose ranks run on several hosts is restarted by every host's supervisor.

    A group's ranks must stop and start together: a restarted rank cannot join the rendezvous that
    its old peers still hold, and a peer waiting for messages rather than in a collective never
    notices that a rank died. On one host the supervisor kills and restarts the whole group. Across
    hosts (``nebula-mq up --ranks``), each supervisor owns only its host's ranks; the hosts of a
    cluster share the job's run directory, so a supervisor that restarts its ranks of a group bumps
    the group's epoch there (``<run_dir>/groups/<group>.epoch``), and every other supervisor with
    ranks in that group, seeing the epoch move, restarts its own.
    """

    def __init__(self, run_dir: Path, groups: set[str]) -> None:
        self.dir = run_dir / "groups"
        self.seen = {g: self.read(g) for g in groups}  # what came before this supervisor is not news

    def read(self, group: str) -> int:
        try:
            return int((self.dir / f"{group}.epoch").read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def bump(self, group: str) -> None:
        """This supervisor restarts its ranks of ``group``: tell the others."""
        epoch = max(self.read(group), self.seen.get(group, 0)) + 1
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / f"{group}.epoch", f"{epoch}\n")
        self.seen[group] = epoch

    def moved(self) -> list[str]:
        """The groups another supervisor restarted since the last look."""
        moved = []
        for group, seen in self.seen.items():
            now = self.read(group)
            if now > seen:
                self.seen[group] = now
                moved.append(group)
        return moved


def _where_named(settings: Settings, cluster: str, overrides: Sequence[EnvOverride]) -> str:
    """Where the job names ``cluster``: ``job.toml [abnet] tail_cluster``, or the override variable."""
    from nebula_mq.stack import DEFAULT_CLUSTERS

    scenario = settings.job.scenario
    for key, value in settings.scenario_section().items():
        if value == cluster or (isinstance(value, (list, tuple)) and cluster in value):
            for override in overrides:
                if override.path == (scenario, key):
                    return f"environment variable {override.variable}"
            return f"{settings.source} [{scenario}] {key}"
    return "the default clusters of `nebula-mq run`" if cluster in DEFAULT_CLUSTERS else settings.source
