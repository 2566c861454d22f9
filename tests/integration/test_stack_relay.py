"""The WAN relay's rate cap, delay, fairness and cut, measured on real TCP sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nebula_mq.atomic import write_json_atomic
from nebula_mq.stack.relay import Relay, Shape

MIB = 1024 * 1024


async def _start(relay: Relay) -> asyncio.base_events.Server:
    return await asyncio.start_server(relay.handle, "127.0.0.1", 0)


def _relay(tmp_path: Path, target_port: int, shape: Shape) -> Relay:
    relay = Relay(0, "127.0.0.1", target_port, tmp_path / "ctl.json", tmp_path / "status.json")
    relay.apply(shape)
    return relay


@contextlib.asynccontextmanager
async def _echo_through_relay(tmp_path: Path, shape: Shape) -> AsyncIterator[tuple[Relay, int, list[bytes]]]:
    """A relay in front of an echo server: the relay, its port, and the first bytes of each
    connection the echo server accepted (b"" for one that sent nothing, b"RST" once reset)."""
    seen: list[bytes] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(b"")
        n = len(seen) - 1
        try:
            while data := await reader.read(65536):
                seen[n] = seen[n] or data
                writer.write(data)
                await writer.drain()
        except ConnectionResetError:
            seen[n] = b"RST"
        writer.close()

    target = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        relay = _relay(tmp_path, target.sockets[0].getsockname()[1], shape)
        server = await _start(relay)
        try:
            yield relay, server.sockets[0].getsockname()[1], seen
        finally:
            server.close()
    finally:
        target.close()


def _control(relay: Relay, **shape: object) -> None:
    """Write the control file as the CLI does (replacing it) and have the relay read it."""
    write_json_atomic(relay.control_file, shape)
    assert relay.poll_control()


async def _sink() -> tuple[asyncio.base_events.Server, dict[int, float]]:
    """Server that reads everything; records when each connection finished, by bytes read."""
    done: dict[int, float] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        while data := await reader.read(MIB):
            n += len(data)
        done[n] = time.monotonic()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), done


def _waited_s() -> float:
    """Seconds this thread (the test's event loop: sender, relay and sink) has so far spent
    ready to run but waiting for a core (``/proc/thread-self/schedstat``, second field).

    The rate checks judge the relay against the time it could run: on a loaded machine the
    kernel may hold the loop off the CPU for a large share of a short transfer, and that time
    is the machine's, not a wait the relay added. The cap itself (the upper bound) is judged on
    the wall clock."""
    return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9


def _rates(nbytes: int, elapsed_s: float, waited_s: float) -> tuple[float, float]:
    """Mbit/s over the wall clock, and over the time the loop was not held off the CPU."""
    return nbytes * 8 / elapsed_s / 1e6, nbytes * 8 / max(elapsed_s - waited_s, 1e-3) / 1e6


async def _send(port: int, nbytes: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    block = b"\x5a" * (4 * MIB)
    left = nbytes
    while left:
        writer.write(block[: min(left, len(block))])
        left -= min(left, len(block))
        await writer.drain()
    writer.write_eof()
    await reader.read()
    writer.close()


@pytest.mark.parametrize("rate_mbit", [60.0, 170.0])
def test_rate_cap_is_accurate_for_4mb_messages(tmp_path: Path, rate_mbit: float) -> None:
    nbytes = int(rate_mbit * 1e6 / 8 * 1.5)  # ~1.5 s of traffic at the cap

    async def run() -> tuple[float, float]:
        sink, done = await _sink()
        relay = _relay(tmp_path, sink.sockets[0].getsockname()[1], Shape(rate_mbit=rate_mbit, delay_ms=20))
        server = await _start(relay)
        t0, w0 = time.monotonic(), _waited_s()
        await _send(server.sockets[0].getsockname()[1], nbytes)
        elapsed, waited = done[nbytes] - t0, _waited_s() - w0
        server.close()
        sink.close()
        return _rates(nbytes, elapsed, waited)

    wall, running = asyncio.run(run())
    print(f"relay cap {rate_mbit} Mbit/s: measured {wall:.1f} Mbit/s, {running:.1f} while on a core")
    assert wall <= 1.05 * rate_mbit
    assert running >= 0.9 * rate_mbit


def test_small_message_on_an_idle_slow_link_takes_its_serialisation_time(tmp_path: Path) -> None:
    """A 32 KiB message over an idle 2 Mbit/s link arrives after ~size/rate (0.13 s), as on a
    real link: the relay's bucket must not save up credit for whole messages while idle."""
    rate_mbit, nbytes = 2.0, 32 * 1024

    async def run() -> list[float]:
        sink, done = await _sink()
        relay = _relay(tmp_path, sink.sockets[0].getsockname()[1], Shape(rate_mbit=rate_mbit))
        server = await _start(relay)
        times = []
        for _ in range(3):
            await asyncio.sleep(0.3)  # idle: a bucket with a big burst would fill up here
            t0 = time.monotonic()
            await _send(server.sockets[0].getsockname()[1], nbytes)
            times.append(done.pop(nbytes) - t0)
        server.close()
        sink.close()
        return times

    serialisation = nbytes * 8 / (rate_mbit * 1e6)
    for elapsed in asyncio.run(run()):
        # No saved-up credit: never faster than the link. The upper bound only says the relay adds
        # no wait of its own, with room for a loaded machine's slow connects.
        assert 0.9 * serialisation <= elapsed <= serialisation + 0.5


def test_two_connections_share_the_cap_fairly(tmp_path: Path) -> None:
    rate = 60.0
    each = int(rate * 1e6 / 8 * 0.75)

    async def run() -> tuple[float, float, float]:
        sink, done = await _sink()
        relay = _relay(tmp_path, sink.sockets[0].getsockname()[1], Shape(rate_mbit=rate))
        server = await _start(relay)
        port = server.sockets[0].getsockname()[1]
        t0, w0 = time.monotonic(), _waited_s()
        # Distinct sizes so the sink can tell the connections apart.
        await asyncio.gather(_send(port, each), _send(port, each + 1))
        waited = _waited_s() - w0
        server.close()
        sink.close()
        return done[each] - t0, done[each + 1] - t0, waited

    t1, t2, waited = asyncio.run(run())
    wall, running = _rates(2 * each, max(t1, t2), waited)
    assert wall <= 1.05 * rate
    assert running >= 0.9 * rate
    # Fair sharing: both finish at about the same time (neither waits for the other).
    assert abs(t1 - t2) < 0.15 * max(t1, t2)


def test_delay_is_added_each_way(tmp_path: Path) -> None:
    async def run() -> float:
        async with _echo_through_relay(tmp_path, Shape(rate_mbit=0, delay_ms=40)) as (_relay_, port, _seen):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            rtts = []
            for _ in range(5):
                t0 = time.monotonic()
                writer.write(b"ping")
                await reader.readexactly(4)
                rtts.append(time.monotonic() - t0)
            writer.close()
        return min(rtts)

    rtt = asyncio.run(run())
    assert 0.080 <= rtt <= 0.100


def test_cut_aborts_connections_and_refuses_new_ones_until_healed(tmp_path: Path) -> None:
    async def run() -> tuple[bytes, bytes, bytes]:
        async with _echo_through_relay(tmp_path, Shape(rate_mbit=0)) as (relay, port, _seen):
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            w1.write(b"a")
            before = await r1.readexactly(1)
            _control(relay, rate_mbit=0, cut=True, generation=1)  # through the control file, as the CLI does
            cut_existing = await asyncio.wait_for(r1.read(10), 2)
            r2, _w2 = await asyncio.open_connection("127.0.0.1", port)
            cut_new = await asyncio.wait_for(r2.read(10), 2)
            relay.apply(Shape(rate_mbit=0, cut=False, generation=2))
            r3, w3 = await asyncio.open_connection("127.0.0.1", port)
            w3.write(b"b")
            healed = await asyncio.wait_for(r3.readexactly(1), 2)
        return before + healed, cut_existing, cut_new

    ok, cut_existing, cut_new = asyncio.run(run())
    assert ok == b"ab"
    assert cut_existing == b"" and cut_new == b""


def test_drop_holds_bytes_and_releases_them_in_order_without_a_reset(tmp_path: Path) -> None:
    """A drop (blackhole) forwards nothing either way but keeps the connection: what was
    written during the drop arrives after the heal, in order and whole; a connection opened
    during the drop is not refused but answered only after the heal; a cut still resets."""

    async def run() -> None:
        async with _echo_through_relay(tmp_path, Shape(rate_mbit=0, delay_ms=10)) as (relay, port, seen):
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            w1.write(b"before")
            assert await asyncio.wait_for(r1.readexactly(6), 2) == b"before"
            _control(relay, rate_mbit=0, delay_ms=10, drop=True, generation=1)
            # 3 MiB in numbered blocks: more than the relay reads in one chunk, so some wait in
            # its sockets' buffers and some in the relay itself.
            sent = b"".join(i.to_bytes(4, "big") * 1024 for i in range(768))
            w1.write(sent)
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)  # not refused: left unanswered
            w2.write(b"late")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(r1.read(1), 0.6)  # nothing comes back through a dropped link ...
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(r2.read(1), 0.1)
            assert relay.counters.accepted == 1 and relay.counters.held == 1 and relay.counters.refused == 0
            assert relay.counters.up == 6 and len(seen) == 1  # ... and nothing went through to the target either
            t_heal = time.monotonic()
            # The heal, possibly in the same mtime tick as the drop's write: the relay sees it all the same.
            _control(relay, rate_mbit=0, delay_ms=10, generation=2)
            got = await asyncio.wait_for(r1.readexactly(len(sent)), 10)
            assert got == sent  # every byte, in order, on the same connection
            assert time.monotonic() - t_heal >= 0.02  # the delay each way still applies after the heal
            assert await asyncio.wait_for(r2.readexactly(4), 2) == b"late"
            w1.write(b"after")
            assert await asyncio.wait_for(r1.readexactly(5), 2) == b"after"
            assert relay.counters.accepted == 2 and relay.counters.refused == 0
            # A drop, then a cut: the cut resets the held connection.
            relay.apply(Shape(rate_mbit=0, drop=True, generation=3))
            r3, _w3 = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.sleep(0.05)
            relay.apply(Shape(rate_mbit=0, drop=True, cut=True, generation=4))
            assert await asyncio.wait_for(r3.read(10), 2) == b""
            assert await asyncio.wait_for(r1.read(10), 2) == b""
            w1.close()
            w2.close()

    asyncio.run(run())


def test_a_client_that_gives_up_during_a_drop_never_reaches_the_target(tmp_path: Path) -> None:
    """A client that connects during a drop, sends its hello and closes (a FIN: its own connect
    timeout) is not connected to the target at the heal; one that stays is, its hello first."""

    async def run() -> None:
        async with _echo_through_relay(tmp_path, Shape(rate_mbit=0, drop=True)) as (relay, port, seen):
            _r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            w1.write(b"hello-1")
            await w1.drain()
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            w2.write(b"hello-2")
            await asyncio.sleep(0.1)
            w1.close()  # FIN, no RST
            await w1.wait_closed()
            await asyncio.sleep(0.1)
            relay.apply(Shape(rate_mbit=0, generation=1))
            assert await asyncio.wait_for(r2.readexactly(7), 2) == b"hello-2"
            await asyncio.sleep(0.2)  # time for a late connection to the target, were there one
            assert seen == [b"hello-2"]
            assert relay.counters.held == 2 and relay.counters.abandoned == 1
            assert relay.counters.accepted == 1 and relay.counters.refused == 0
            w2.close()

    asyncio.run(run())


def test_a_reset_passes_on_as_a_reset_and_shutdown_ends_held_connections(tmp_path: Path) -> None:
    """A client's RST reaches the target as an RST (not a FIN), after the heal when it came during
    a drop; at shutdown, relayed and waiting connections are aborted and their handlers end."""

    async def run() -> None:
        async with _echo_through_relay(tmp_path, Shape(rate_mbit=0)) as (relay, port, seen):
            _r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.sleep(0.1)
            relay.apply(Shape(rate_mbit=0, drop=True, generation=1))
            # An RST during the drop (linger 0: a plain close or abort would send a FIN).
            w1.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w1.transport.abort()
            await asyncio.sleep(0.2)
            assert seen == [b""]  # held by the drop
            relay.apply(Shape(rate_mbit=0, generation=2))
            await asyncio.sleep(0.2)
            assert seen == [b"RST"]
            relay.apply(Shape(rate_mbit=0, drop=True, generation=3))
            _r2, _w2 = await asyncio.open_connection("127.0.0.1", port)  # waits at the gate
            await asyncio.sleep(0.1)
            assert len(relay._waiting) == 1
            await asyncio.wait_for(relay.shutdown(), 2)  # returns although the gate stays closed
            assert not relay._waiting and not relay._handlers

    asyncio.run(run())
