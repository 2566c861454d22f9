"""One direction of one relayed connection: read, pace, delay, deliver; held while the link drops.

The relay (:mod:`nebula_mq.stack.relay`) runs two pumps per connection. A pump

1. reads large pieces (``CHUNK``),
2. waits at the relay's :class:`Gate` while the link is *dropped* (blackholed),
3. paces them by a :class:`TokenBucket` shared by all connections of the relay in that
   direction (the link's capacity; an ``asyncio.Lock`` makes waiting FIFO, so connections
   share it fairly chunk by chunk),
4. delivers them ``delay`` after they left the bucket (propagation delay), in order, with
   ``drain()`` so a slow receiver pushes back on the sender through TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable

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
