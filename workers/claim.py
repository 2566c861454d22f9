"""One process per rank, on its own host: checked before a rank touches anything of its job.

The hosts of a cluster share the job's ``run_dir`` (checkpoints, logs, status files, the group's
restart epochs). A rank started twice (the same ``up`` on two hosts, a second ``nebula-mq
worker`` by hand) would join its group's store beside the real one, write into its log and its
status, and make its group restart; a rank started on a host the job file does not place it on
would do the same from the wrong address. Both are refused here, in one line, before the log,
the status, the store or the broker is touched:

* **placement**: a rank the job file places on a host (``[split] head_hosts``, ``[electra]
  disc_hosts``, ``[replicas.hosts]``) runs where that host's address is one of this machine's;
* **one at a time**: a rank holds an exclusive lock on ``<run_dir>/claims/<worker>.lock`` while
  it runs (``flock``; NFS takes it too), and writes who holds it there, for the refusal's line.

The launcher (``run``, ``up``) claims its workers before it starts them and keeps the claims
across their restarts; each worker inherits its claim's descriptor (:data:`CLAIM_FD_ENV`), so a
worker that outlives a killed ``up`` still holds it. A worker started by hand, or a user's own
script (``run_head``/``run_tail``), claims its rank itself.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from nebula_mq.errors import PlacementError, WorkerError
from nebula_mq.models.group_address import interface_with, resolve
from nebula_mq.settings import Settings
from workers.processes import Process

# The descriptor of the claim a launcher holds for the worker it started.
CLAIM_FD_ENV = "NEBULA_CLAIM_FD"


@dataclass
class Claim:
    """A rank's lock, held while ``fd`` is open (by this process or one it started)."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:  # a holder dropped without release (an object of a test) holds nothing
        self.release()


def claim_path(settings: Settings, proc: Process) -> Path:
    return settings.run_dir / "claims" / f"{proc.worker_id}.lock"


def check_placement(settings: Settings, proc: Process) -> None:
    """``proc`` may run on this machine: the job file places it nowhere, or on an address of
    this machine (a PlacementError naming the host otherwise)."""
    if not proc.host:
        return
    try:
        address = resolve(proc.host)
    except WorkerError as exc:  # a name that does not resolve is the job file's
        raise PlacementError(f"{proc.worker_id} is placed on {proc.host!r} by {settings.source}: {exc}") from None
    if ipaddress.ip_address(address).is_loopback or interface_with(address) is not None:
        return
    raise PlacementError(f"{proc.worker_id} ({proc.cluster}) is placed on {proc.host} ({address}) by "
                         f"{settings.source}, which is not this host ({socket.gethostname()}): start it on "
                         f"{proc.host}, or fix the job's hosts")


def claim_rank(settings: Settings, proc: Process, holder: str) -> Claim:
    """Check ``proc``'s placement, then hold its lock (``holder``: who runs it, for the line a
    second claimant reads). A rank that already runs is a :class:`PlacementError` naming
    where and since when; an inherited claim (:data:`CLAIM_FD_ENV`) is taken as is."""
    check_placement(settings, proc)
    path = claim_path(settings, proc)
    inherited = _inherited(path)
    if inherited is not None:
        return Claim(path, inherited)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise PlacementError(f"cannot lock {path}: {exc.strerror}") from None
        raise PlacementError(f"{proc.worker_id} ({proc.cluster}) of job {settings.job.id} is already running "
                             f"({_holder(path)}): refused, nothing touched. Stop that one first, or start "
                             f"another rank (up --ranks)") from None
    body = {"holder": holder, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(body, sort_keys=True).encode(), 0)
    return Claim(path, fd)


def _inherited(path: Path) -> int | None:
    """The descriptor of ``path``'s lock this process was given by its launcher, if any."""
    value = os.environ.get(CLAIM_FD_ENV, "")
    if not value.isdigit():
        return None
    fd = int(value)
    try:
        same = os.path.exists(path) and os.fstat(fd).st_ino == os.stat(path).st_ino
    except OSError:
        return None
    return fd if same else None


def _holder(path: Path) -> str:
    """Who holds ``path``'s lock, as its holder wrote it: ``up (pid 1234) on b2 since 17:03:12 UTC``."""
    try:
        body = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        body = {}
    if not body:
        return "by another process"
    since = time.strftime("%H:%M:%S UTC", time.gmtime(float(body.get("since", 0))))
    return f"{body.get('holder', 'a process')} (pid {body.get('pid', '?')}) on {body.get('host', '?')} since {since}"
