"""Manage the emulated WAN: one relay process per link endpoint, shaped through control files.

A *link* is named after the cluster it leads to (``to-cluster-a``): the relay
listens on that node's ``relay_port`` and forwards to its TLS port, so every
peer's federation upstream pointing at cluster A crosses it. Files per link under
``RUN/wan/``: ``<link>.json`` (control, written here), ``<link>.status.json``
(written by the relay), ``<link>.pid`` and ``<link>.log``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from nebula_mq.errors import StackError
from nebula_mq.stack.layout import NodeLayout, StackLayout, running_pid, wait_until
from nebula_mq.stack.relay import Shape
from nebula_mq.atomic import write_json_atomic

APPLY_TIMEOUT_S = 5.0


def read_shape(control_file: Path) -> Shape:
    """The shape last written to a relay's control file (the default before any)."""
    try:
        return Shape.from_dict(dict(json.loads(control_file.read_text())))[0]
    except FileNotFoundError:
        return Shape()
    except (OSError, ValueError, TypeError) as exc:
        raise StackError(f"{control_file}: unreadable ({exc})") from None


def apply_shape(name: str, control_file: Path, status_file: Path, wait: bool, **changes: Any) -> Shape:
    """Write the relay's shape with ``changes`` and the next generation; with ``wait``, return
    once the relay echoes that generation in its status file (StackError after 5 s)."""
    shape = replace(read_shape(control_file), **changes)
    if shape.rate_mbit < 0 or shape.delay_ms < 0:
        raise StackError(f"{name}: rate and delay must be >= 0, got {shape}")
    shape = replace(shape, generation=shape.generation + 1)
    data = asdict(shape)
    if not shape.drop:
        del data["drop"]  # a relay started before drop existed rejects the key; absent = False
    write_json_atomic(control_file, data)
    if wait and not wait_until(
            lambda: read_status(status_file).get("shape", {}).get("generation") == shape.generation,
            APPLY_TIMEOUT_S, every=0.02):
        raise StackError(f"{name}: relay did not apply the new shape within {APPLY_TIMEOUT_S}s")
    return shape


def read_status(status_file: Path) -> dict[str, Any]:
    """What a relay last wrote in its status file ({} before it wrote one)."""
    try:
        return dict(json.loads(status_file.read_text()))
    except (OSError, ValueError, TypeError):
        return {}


class Link:
    """The relay in front of one node."""

    def __init__(self, layout: StackLayout, node: NodeLayout) -> None:
        self.node = node
        self.name = f"to-{node.cluster}"
        d = layout.wan_dir
        self.control_file = d / f"{self.name}.json"
        self.status_file = d / f"{self.name}.status.json"
        self.pid_file = d / f"{self.name}.pid"
        self.log_file = d / f"{self.name}.log"

    # ------------------------------------------------------------------ shape

    def shape(self) -> Shape:
        return read_shape(self.control_file)

    def set_shape(self, wait: bool = True, **changes: Any) -> Shape:
        """Change the link (rate_mbit, delay_ms, cut, drop); waits until a running relay applied it."""
        return apply_shape(self.name, self.control_file, self.status_file, wait and self.pid() is not None,
                           **changes)

    def status(self) -> dict[str, Any]:
        return read_status(self.status_file)

    # ------------------------------------------------------------------ process

    def pid(self) -> int | None:
        """Pid of the running relay, or None (a stale pidfile is ignored)."""
        return running_pid(self.pid_file, b"nebula_mq.stack.relay", self.name.encode())

    def start(self) -> None:
        if self.pid() is not None:
            return
        if not self.control_file.exists():
            self.set_shape(wait=False)
        cmd = [sys.executable, "-m", "nebula_mq.stack.relay", "--daemon",
               "--listen-port", str(self.node.relay_port),
               "--target", f"127.0.0.1:{self.node.tls_port}",
               "--control", str(self.control_file), "--status", str(self.status_file),
               "--pidfile", str(self.pid_file), "--log", str(self.log_file)]
        src_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src_root, os.environ.get("PYTHONPATH")])))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0 or self.pid() is None:
            raise StackError(f"relay {self.name} failed to start; see {self.log_file}: {proc.stderr[-500:]}")

    def stop(self, timeout: float = 5.0) -> None:
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        if not wait_until(lambda: self.pid() is None, timeout, every=0.05):
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)


def links(layout: StackLayout, cluster: str | None = None) -> list[Link]:
    """All links, or only the one leading to ``cluster``."""
    nodes = layout.nodes if cluster is None else (layout.node(cluster),)
    return [Link(layout, n) for n in nodes]
