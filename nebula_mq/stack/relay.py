"""A user-space TCP relay that emulates one WAN link: latency, a bandwidth cap, cuts and drops.

``tc netem`` is missing on this kernel, so the stack forwards each federation link
through this relay: two pumps per connection (:func:`pump`), one each way. A pump

1. reads large pieces (``CHUNK``),
2. waits at the relay's :class:`Gate` while the link is *dropped* (blackholed),
3. paces them by a :class:`TokenBucket` shared by all connections of the relay in that
   direction (the link's capacity; an ``asyncio.Lock`` makes waiting FIFO, so connections
   share it fairly chunk by chunk),
4. delivers them ``delay`` after they left the bucket (propagation delay), in order, with
   ``drain()`` so a slow receiver pushes back on the sender through TCP.

The relay reads its shape from a JSON control file (see :mod:`nebula_mq.stack.wan`)
that it polls, and reports the applied ``generation``, byte counters and open
connections in a status file. Two kinds of outage, until healed:

* ``cut`` aborts every open connection and closes new ones at once (the link refuses
  traffic: a reset, as a router that answers with RSTs);
* ``drop`` blackholes the link: every connection stays open, nothing crosses either
  way (what is read is held and flows, in order, after the heal), and a new connection
  is answered only after the heal (one whose client gives up first never reaches the
  target). A cut wins over a drop.

Run as ``python -m nebula_mq.stack.relay --daemon ...``: the parent returns once
the relay listens, the relay itself is re-parented to init (pidfile given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from nebula_mq.atomic import write_json_atomic

POLL_S = 0.05
CHUNK = 256 * 1024
# The bucket holds at most this many seconds of traffic: keeps bursts short.
BURST_S = 0.01
# ... and at least one MTU, so a sleep that overshoots is made up for. No more:
# on a real link a message takes size / rate to cross however idle the link
# was, and a larger floor let small messages through a slow link instantly.
MIN_BURST = 1500
MIN_BUFFER = 4 * 1024 * 1024


class TokenBucket:
    """Paces bytes to ``rate`` bytes/s; a debt is slept off, so large chunks stay exact."""

    def __init__(self, rate: float) -> None:
        self._lock = asyncio.Lock()
        self.rate = rate
        self._tokens = 0.0
        self._stamp = time.monotonic()

    def set_rate(self, rate: float) -> None:
        self._refill()
        self.rate = rate

    def _refill(self) -> None:
        now = time.monotonic()
        if self.rate > 0:
            burst = max(self.rate * BURST_S, MIN_BURST)
            self._tokens = min(burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def take(self, n: int) -> None:
        async with self._lock:
            if self.rate <= 0:
                return
            self._refill()
            self._tokens -= n
            if self._tokens < 0:
                await asyncio.sleep(-self._tokens / self.rate)


class Gate:
    """Open unless the link is dropped: what is read while it is closed waits here, in order.

    A blackholed link loses packets and TCP sends them again once it carries traffic, so the
    bytes a side wrote during the drop arrive after the heal, in order, with nothing reset. The
    relay terminates TCP on loopback and cannot lose packets, so it holds them instead; the end
    of a stream (FIN) and a reset (RST) are held too, as a real drop would lose them as well:
    the pump passes a held FIN on as a FIN and a held reset as a reset (the relay aborts the
    peer) once the gate opens. They leave at the heal, as if every sender's retransmission timer
    fired right then: the best case of TCP (a sender deep in exponential backoff sends its first
    retransmission up to one backoff interval later; that is the endpoints' TCP, which the relay
    does not model).

    Only what enters the link waits here: bytes already in a pump's delay line (at most its
    ``limit()``) have passed the point of the outage, as packets beyond a failed hop, and
    still reach the receiver during the drop.
    """

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()

    @property
    def closed(self) -> bool:
        return not self._open.is_set()

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def passage(self) -> None:
        """Return at once while open, else at the heal."""
        await self._open.wait()

    async def hold(self, reader: asyncio.StreamReader, most: int = CHUNK) -> bytes | None:
        """Wait for the heal while reading what the client sends meanwhile (up to ``most`` bytes,
        the rest stays in its socket): those bytes, or None if the client closed (FIN or RST)
        first. A client that gave up during the drop must not reach the target at the heal."""
        held = bytearray()
        passage = asyncio.ensure_future(self.passage())
        try:
            while not passage.done():
                if len(held) >= most:
                    await passage
                    break
                read = asyncio.ensure_future(reader.read(most - len(held)))
                done, _ = await asyncio.wait({passage, read}, return_when=asyncio.FIRST_COMPLETED)
                if read not in done:
                    read.cancel()  # a cancelled read consumes nothing: the bytes stay in the reader
                    with contextlib.suppress(asyncio.CancelledError):
                        await read
                    break
                try:
                    data = read.result()
                except OSError:
                    return None
                if not data:
                    return None
                held += data
            return bytes(held)
        finally:
            passage.cancel()


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, bucket: TokenBucket, gate: Gate,
               delay_s: Callable[[], float], limit: Callable[[], float], count: Callable[[int], None],
               first: bytes = b"") -> None:
    """Forward ``reader`` to ``writer`` until the end of the stream, then pass the EOF on.

    ``delay_s()``: the one-way delay now; ``limit()``: the most bytes to hold in the delay
    line before pushing back on the sender; ``count(n)``: called for each chunk delivered;
    ``first``: bytes already read from ``reader`` (held during a drop), sent before the rest.
    A reset (``OSError``) propagates, after the heal when it came during a drop.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
    space = asyncio.Event()
    queued = 0

    async def deliver() -> None:
        nonlocal queued
        while (item := await queue.get()) is not None:
            due, data = item
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
            queued -= len(data)
            count(len(data))
            space.set()
        if writer.can_write_eof():
            writer.write_eof()

    task = asyncio.create_task(deliver())
    try:
        while True:
            try:
                data, first = (first or await reader.read(CHUNK)), b""
            except OSError:
                await gate.passage()  # the relay aborts the peer: a reset in a drop reaches it after the heal
                raise
            # Bytes (or the EOF) read during a drop: held, so they enter the link after the heal.
            # What entered before the drop is already on the wire and still arrives on time.
            await gate.passage()
            if not data:
                break
            await bucket.take(len(data))
            queued += len(data)
            await queue.put((loop.time() + delay_s(), data))
            # Hold at most ``limit()`` (~2x the bandwidth-delay product): TCP pushes back on the sender.
            while queued > limit() and not task.done():
                space.clear()
                await space.wait()
        await queue.put(None)
        await task
    finally:
        task.cancel()


def send_reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST: ``abort()`` alone closes the socket, and the kernel sends a FIN unless
    data is left unread; linger 0 makes it a reset."""
    with contextlib.suppress(OSError, AttributeError):  # a side already closed (it was the one reset)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> tuple[Shape, list[str]]:
        """The shape in ``data``, and its unknown keys (a newer writer's: ignored, the rest applies)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known}), sorted(set(data) - known)


@dataclass
class Counters:
    # Bytes forwarded client -> target ("up") and target -> client ("down").
    up: int = 0
    down: int = 0
    accepted: int = 0
    refused: int = 0
    held: int = 0  # connections that arrived during a drop and waited for the heal
    abandoned: int = 0  # of those, the ones whose client closed first: the target never saw them


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

    def __post_init__(self) -> None:  # ends by applying ``shape``: a drop closes the gate from the start
        self._buckets = {"up": TokenBucket(self._bps()), "down": TokenBucket(self._bps())}
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._waiting: set[asyncio.StreamWriter] = set()  # accepted during a drop, not yet relayed
        self._handlers: set[asyncio.Task[Any]] = set()  # one per accepted connection, cancelled at shutdown
        self._gate = Gate()
        # The control file as last read: (st_mtime_ns, st_ino, st_size). Writers replace the file
        # (write_json_atomic), so the inode changes on every write even within one mtime tick.
        self._control_id: tuple[int, int, int] | None = None
        self.apply(self.shape)

    def _bps(self) -> float:
        return self.shape.rate_mbit * 1e6 / 8

    # ------------------------------------------------------------------ control

    def apply(self, shape: Shape) -> None:
        self.shape = shape
        for bucket in self._buckets.values():
            bucket.set_rate(self._bps())
        if shape.cut:
            self._abort_all()
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
        ident = (st.st_mtime_ns, st.st_ino, st.st_size)
        if ident == self._control_id:
            return False
        self._control_id = ident
        try:
            shape, unknown = Shape.from_dict(dict(json.loads(self.control_file.read_text())))
        except (OSError, ValueError, TypeError) as exc:
            print(f"relay: ignoring bad control file: {exc}", file=sys.stderr, flush=True)
            return False
        if unknown:
            print(f"relay: ignoring unknown control keys {unknown}", file=sys.stderr, flush=True)
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

    def _abort_all(self) -> None:
        for w in [w for pair in self._conns for w in pair] + list(self._waiting):
            w.transport.abort()

    def _refuse(self, *writers: asyncio.StreamWriter) -> None:
        self.counters.refused += 1
        for w in writers:
            w.transport.abort()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if (task := asyncio.current_task()) is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        # Cancelled by shutdown(): end quietly (asyncio's stream callback would log a cancelled task).
        with contextlib.suppress(asyncio.CancelledError):
            await self._relay(reader, writer)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.shape.cut:
            return self._refuse(writer)
        first = b""
        if self._gate.closed:
            # A blackholed link loses a SYN: the client retries until its own timeout; refusing would
            # say the port is closed. The kernel here has completed the handshake, so the relay answers
            # nothing and opens the target only after the heal; meanwhile it keeps the client's first
            # bytes (its TLS hello) and sees a client that gives up: that one never reaches the target.
            self.counters.held += 1
            self._waiting.add(writer)
            try:
                held = await self._gate.hold(reader)
            finally:
                self._waiting.discard(writer)
            if self.shape.cut:  # a cut while waiting aborted it (or would have)
                return self._refuse(writer)
            if held is None:  # the client gave up: nothing reaches the target
                self.counters.abandoned += 1
                return writer.transport.abort()
            first = held
        try:
            t_reader, t_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            return self._refuse(writer)
        if self.shape.cut:  # the cut landed while connecting: apply() did not see this pair
            return self._refuse(writer, t_writer)
        self.counters.accepted += 1
        pair = (writer, t_writer)
        self._conns.add(pair)
        reset = False
        try:
            await asyncio.gather(self._pump(reader, t_writer, "up", first), self._pump(t_reader, writer, "down"))
        except (OSError, asyncio.IncompleteReadError):
            reset = True
        finally:
            self._conns.discard(pair)
            for w in pair:
                if reset:
                    send_reset(w)  # passed on as a reset (a plain abort sends a FIN)
                elif self.shape.cut:
                    w.transport.abort()  # a cut drops data in flight, like a pulled cable
                else:
                    w.close()

    async def shutdown(self) -> None:
        """Abort every connection, relayed or waiting for a heal, and end their handlers."""
        self._abort_all()
        for task in list(self._handlers):
            task.cancel()  # a pump held at a closed gate does not see its transport aborted
        await asyncio.gather(*self._handlers, return_exceptions=True)

    def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, way: str,
              first: bytes = b"") -> Awaitable[None]:
        def count(n: int) -> None:
            setattr(self.counters, way, getattr(self.counters, way) + n)

        return pump(reader, writer, self._buckets[way], self._gate, lambda: self.shape.delay_ms / 1000.0,
                    # Hold at most ~2x the bandwidth-delay product: TCP pushes back on the sender.
                    lambda: max(MIN_BUFFER, 2 * self._bps() * self.shape.delay_ms / 1000.0), count, first)


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
        await relay.shutdown()  # held and waiting connections would keep serve() from returning
    control.cancel()
    relay.status_file.unlink(missing_ok=True)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="nebula_mq.stack.relay", description=__doc__.splitlines()[0])
    p.add_argument("--listen-port", type=int, required=True)
    p.add_argument("--listen-host", default="127.0.0.1", help="address to listen on (default loopback)")
    p.add_argument("--target", required=True, help="HOST:PORT")
    for name in ("--control", "--status"):
        p.add_argument(name, type=Path, required=True)
    for name in ("--pidfile", "--log"):
        p.add_argument(name, type=Path)
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
        os.dup2(os.open(os.devnull, os.O_RDWR), 0)
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
