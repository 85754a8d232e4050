"""LoopIdleProbe: trio's own answer (wait_all_tasks_blocked) without a pass of its scheduler."""

from __future__ import annotations

import socket
import time

import trio
from trio.testing import wait_all_tasks_blocked

from kproxy.obs.loop_idle import LoopIdleProbe


def test_outside_trio_the_probe_is_not_available_and_never_says_idle() -> None:
    probe = LoopIdleProbe()
    assert not probe.available
    assert not probe.idle()


async def test_the_installed_trio_keeps_what_the_probe_reads() -> None:
    # A trio that moved its internals fails here, not as a silently slower trace writer.
    assert LoopIdleProbe().available


async def test_idle_when_every_task_waits_and_nothing_is_due() -> None:
    probe = LoopIdleProbe()
    a, b = trio.socket.socketpair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.recv, 1)
        nursery.start_soon(trio.sleep, 60)
        await wait_all_tasks_blocked(0)
        assert probe.idle()
        nursery.cancel_scope.cancel()
    a.close()
    b.close()


async def test_not_idle_while_a_task_waits_to_run() -> None:
    probe = LoopIdleProbe()
    ran = []

    async def run() -> None:
        ran.append(1)

    async with trio.open_nursery() as nursery:
        await wait_all_tasks_blocked(0)
        nursery.start_soon(run)
        assert not probe.idle()
    assert ran == [1]


async def test_not_idle_when_a_socket_is_ready_and_trio_still_sees_it() -> None:
    probe = LoopIdleProbe()
    plain_a, b = socket.socketpair()
    a = trio.socket.from_stdlib_socket(plain_a)
    got = []

    async def read() -> None:
        got.append(await a.recv(1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await wait_all_tasks_blocked(0)
        assert probe.idle()
        b.send(b"x")  # a blocking socket's send from this task: no await, no scheduler pass
        assert not probe.idle()
        assert not probe.idle()  # looking took nothing from trio: it still wakes the reader
    assert got == [b"x"]
    a.close()
    b.close()


async def test_not_idle_once_a_deadline_has_passed() -> None:
    probe = LoopIdleProbe()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 0.001)
        await wait_all_tasks_blocked(0)
        time.sleep(0.005)  # the sleeper's deadline passes while this task keeps the loop
        assert not probe.idle()
