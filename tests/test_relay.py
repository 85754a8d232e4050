"""The relay moves exactly the bytes it is asked to, and fails as its callers expect."""

from __future__ import annotations

import os

import pytest
import trio

from kproxy.io import net, relay


def _pair() -> tuple[trio.socket.SocketType, trio.socket.SocketType]:
    a, b = trio.socket.socketpair()
    return a, b


async def _read_exactly(sock: trio.socket.SocketType, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = await sock.recv(n - len(out))
        assert chunk, "peer closed early"
        out += chunk
    return bytes(out)


async def test_moves_exactly_n_bytes_and_leaves_the_rest() -> None:
    src_in, src = _pair()
    dst, dst_out = _pair()
    body = os.urandom(3 * relay.CHUNK_BYTES + 12345)
    trailer = b"next frame"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(net.send_all, src_in, body + trailer)
        received: list[bytes] = []

        async def read_all() -> None:
            received.append(await _read_exactly(dst_out, len(body)))

        nursery.start_soon(read_all)
        await relay.forward(src, dst, len(body), trio.Lock())
    assert received == [body]
    assert await _read_exactly(src, len(trailer)) == trailer


async def test_concurrent_moves_do_not_share_a_buffer() -> None:
    # The destinations are read only after both relays are under way, so
    # each relay waits with a chunk in hand while the other one runs.
    pairs = [(_pair(), _pair()) for _ in range(3)]
    bodies = [os.urandom(2 * relay.CHUNK_BYTES + i) for i in range(3)]
    received: dict[int, bytes] = {}
    async with trio.open_nursery() as nursery:
        for i, ((src_in, src), (dst, _)) in enumerate(pairs):
            nursery.start_soon(net.send_all, src_in, bodies[i])
            nursery.start_soon(relay.forward, src, dst, len(bodies[i]), trio.Lock())
        await trio.sleep(0.05)

        async def read(i: int) -> None:
            received[i] = await _read_exactly(pairs[i][1][1], len(bodies[i]))

        for i in range(3):
            nursery.start_soon(read, i)
    assert [received[i] for i in range(3)] == bodies


async def test_source_closing_inside_the_frame_is_eof() -> None:
    src_in, src = _pair()
    dst, _dst_out = _pair()
    await net.send_all(src_in, b"x" * 100)
    src_in.close()
    with pytest.raises(EOFError):
        await relay.forward(src, dst, 1000, trio.Lock())


async def test_closed_destination_is_a_sink_failure() -> None:
    src_in, src = _pair()
    dst, dst_out = _pair()
    dst_out.close()
    await net.send_all(src_in, b"x" * 100_000)
    with pytest.raises(relay.SinkFailed):
        await relay.forward(src, dst, 100_000, trio.Lock())


async def test_socket_closed_by_another_task_is_a_source_failure() -> None:
    src_in, src = _pair()
    dst, _dst_out = _pair()

    async def close_soon() -> None:
        await trio.sleep(0.05)
        src.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close_soon)
        with pytest.raises(relay.SourceFailed):
            await relay.forward(src, dst, 1000, trio.Lock())


async def test_the_destination_lock_is_held_for_the_whole_move() -> None:
    src_in, src = _pair()
    dst, dst_out = _pair()
    lock = trio.Lock()
    seen_locked: list[bool] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.forward, src, dst, 10, lock)
        await trio.sleep(0.02)  # the relay now waits for its source, lock held
        seen_locked.append(lock.locked())
        await net.send_all(src_in, b"0123456789")
    assert seen_locked == [True]
    assert not lock.locked()
    assert await _read_exactly(dst_out, 10) == b"0123456789"
