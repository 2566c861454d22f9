"""A user-space TCP relay that emulates one WAN link: latency, a bandwidth cap, cuts and drops.

``tc netem`` is missing on this kernel, so the stack forwards each federation link
through this relay: two pumps per connection (:mod:`nebula_mq.stack.pump`) read,
pace by a token bucket per direction, delay and deliver in order.

The relay reads its shape from a JSON control file (see :mod:`nebula_mq.stack.wan`)
that it polls, and reports the applied ``generation``, byte counters and open
connections in a status file. Two kinds of outage, until healed:

* ``cut`` aborts every open connection and closes new ones at once (the link refuses
  traffic: a reset, as a router that answers with RSTs);
* ``drop`` blackholes the link: every connection stays open, nothing crosses either
  way (what is read is held and flows, in order, after the heal), and a new connection
  is answered only after the heal. A cut wins over a drop.

Run as ``python -m nebula_mq.stack.relay --daemon ...``: the parent returns once
the relay listens, the relay itself is re-parented to init (pidfile given).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from nebula_mq.atomic import write_json_atomic
from nebula_mq.stack.pump import BURST_S, CHUNK, MIN_BUFFER, Gate, TokenBucket, pump

__all__ = ["BURST_S", "CHUNK", "Counters", "Relay", "Shape"]

POLL_S = 0.05


@dataclass(frozen=True)
class Shape:
    """What the link looks like now; written by the CLI, applied by the relay."""

    # Capacity per direction in Mbit/s (10**6 bit/s); 0 = unlimited.
    rate_mbit: float = 60.0
    # One-way propagation delay added to every chunk.
    delay_ms: float = 0.0
    cut: bool = False
    # Blackholed: connections kept, no byte crosses until the heal (``cut`` wins when both).
    drop: bool = False
    # Bumped by every write, echoed in the status file once applied.
    generation: int = 0


@dataclass
class Counters:
    # Bytes forwarded client -> target ("up") and target -> client ("down").
    up: int = 0
    down: int = 0
    accepted: int = 0
    refused: int = 0
    # Connections that arrived during a drop and waited for the heal before reaching the target.
    held: int = 0


@dataclass
class Relay:
    listen_port: int
    target_host: str
    target_port: int
    control_file: Path
    status_file: Path
    shape: Shape = field(default_factory=Shape)
    counters: Counters = field(default_factory=Counters)
    # Where it listens: loopback for the local stack; a host's link address in front of its broker
    # when the delay is added on a link between network namespaces (bench transport --netns).
    listen_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self._buckets = {"up": TokenBucket(self._bps()), "down": TokenBucket(self._bps())}
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._waiting: set[asyncio.StreamWriter] = set()  # accepted during a drop, not yet relayed
        self._gate = Gate()
        self._control_mtime = 0.0

    def _bps(self) -> float:
        return self.shape.rate_mbit * 1e6 / 8

    # ------------------------------------------------------------------ control

    def apply(self, shape: Shape) -> None:
        self.shape = shape
        for bucket in self._buckets.values():
            bucket.set_rate(self._bps())
        if shape.cut:
            for a, b in list(self._conns):
                a.transport.abort()
                b.transport.abort()
            for w in list(self._waiting):
                w.transport.abort()
        # Closed only while dropped and not cut: a cut has aborted what the gate would hold.
        if shape.drop and not shape.cut:
            self._gate.close()
        else:
            self._gate.open()

    def poll_control(self) -> bool:
        try:
            st = self.control_file.stat()
        except FileNotFoundError:
            return False
        if st.st_mtime_ns == self._control_mtime:
            return False
        self._control_mtime = st.st_mtime_ns
        try:
            data = json.loads(self.control_file.read_text())
            shape = Shape(**data)
        except (OSError, ValueError, TypeError) as exc:
            print(f"relay: ignoring bad control file: {exc}", file=sys.stderr, flush=True)
            return False
        if shape != self.shape:
            self.apply(shape)
        return True

    def write_status(self) -> None:
        data = {"pid": os.getpid(), "listen_port": self.listen_port,
                "target": f"{self.target_host}:{self.target_port}", "shape": asdict(self.shape),
                "connections": len(self._conns), "waiting": len(self._waiting), "counters": asdict(self.counters),
                "time": time.time()}
        write_json_atomic(self.status_file, data)

    async def control_loop(self) -> None:
        last = 0.0
        while True:
            changed = self.poll_control()
            if changed or time.monotonic() - last > 1.0:
                self.write_status()
                last = time.monotonic()
            await asyncio.sleep(POLL_S)

    # ------------------------------------------------------------------ forwarding

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.shape.cut:
            self.counters.refused += 1
            writer.transport.abort()
            return
        if self._gate.closed:
            # A blackholed link does not answer a SYN: the client waits for its own timeout and
            # retries, and a SYN sent again after the heal gets through. Refusing would tell it
            # at once that the link is up and the port closed. This host's kernel has already
            # completed the handshake, so the nearest a user-space relay gets is to answer nothing
            # (the client's first bytes, its TLS hello, wait in the socket) and to open the target
            # only after the heal; a client that gave up by then finds its late connection closed.
            self.counters.held += 1
            self._waiting.add(writer)
            try:
                await self._gate.passage()
            finally:
                self._waiting.discard(writer)
            if self.shape.cut or writer.transport.is_closing():
                self.counters.refused += 1
                writer.transport.abort()
                return
        try:
            t_reader, t_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            self.counters.refused += 1
            writer.transport.abort()
            return
        self.counters.accepted += 1
        pair = (writer, t_writer)
        self._conns.add(pair)
        try:
            await asyncio.gather(self._pump(reader, t_writer, "up"), self._pump(t_reader, writer, "down"))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._conns.discard(pair)
            for w in pair:
                if self.shape.cut:
                    w.transport.abort()  # a cut link drops data in flight, like a pulled cable
                else:
                    w.close()

    def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, way: str) -> Awaitable[None]:
        def count(n: int) -> None:
            setattr(self.counters, way, getattr(self.counters, way) + n)

        return pump(reader, writer, self._buckets[way], self._gate, lambda: self.shape.delay_ms / 1000.0,
                    # Hold at most ~2x the bandwidth-delay product: TCP pushes back on the sender.
                    lambda: max(MIN_BUFFER, 2 * self._bps() * self.shape.delay_ms / 1000.0), count)


async def serve(relay: Relay, ready_fd: int | None) -> None:
    relay.poll_control()
    server = await asyncio.start_server(relay.handle, relay.listen_host, relay.listen_port, reuse_address=True)
    relay.write_status()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    control = asyncio.create_task(relay.control_loop())
    async with server:
        await stop.wait()
    control.cancel()
    relay.status_file.unlink(missing_ok=True)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="nebula_mq.stack.relay", description=__doc__.splitlines()[0])
    p.add_argument("--listen-port", type=int, required=True)
    p.add_argument("--listen-host", default="127.0.0.1", help="address to listen on (default loopback)")
    p.add_argument("--target", required=True, help="HOST:PORT")
    p.add_argument("--control", type=Path, required=True)
    p.add_argument("--status", type=Path, required=True)
    p.add_argument("--pidfile", type=Path)
    p.add_argument("--log", type=Path)
    p.add_argument("--daemon", action="store_true", help="detach; return once listening")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    host, _, port = args.target.rpartition(":")
    relay = Relay(args.listen_port, host or "127.0.0.1", int(port), args.control, args.status,
                  listen_host=args.listen_host)
    ready_fd = None
    if args.daemon:
        r, w = os.pipe()
        if os.fork() > 0:
            os.close(w)
            with os.fdopen(r, "rb") as fh:
                ok = fh.readline() == b"ready\n"
            return 0 if ok else 1
        os.close(r)
        os.setsid()
        ready_fd = w
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        if args.log:
            log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
    if args.pidfile:
        args.pidfile.write_text(f"{os.getpid()}\n")
    try:
        asyncio.run(serve(relay, ready_fd))
    except OSError as exc:
        print(f"relay: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
