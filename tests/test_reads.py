"""Socket reads allocate what arrived (kproxy.io.reads), so held reads cannot fragment the heap.

`os.read(fd, 256 KiB)` allocates 256 KiB and shrinks the block to what
arrived; with some of those reads held for a while, glibc's heap grew
through a soak while the live memory stayed flat (docs/reliability.md).
"""

from __future__ import annotations

import ctypes
import select
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from kproxy.io.reads import READ_BYTES, read_exact_size


def test_a_read_returns_what_arrived_as_its_own_bytes() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        a.sendall(b"first read")
        first = read_exact_size(b.fileno(), READ_BYTES)
        a.sendall(b"second!!!!")
        second = read_exact_size(b.fileno(), 6)
        rest = read_exact_size(b.fileno(), 10 * READ_BYTES)
        # Each read is a bytes object of its own: the shared buffer's next read changes none of them.
        assert (first, second, rest) == (b"first read", b"second", b"!!!!")
        assert type(first) is bytes
        with pytest.raises(BlockingIOError):
            read_exact_size(b.fileno(), READ_BYTES)
        # More than one read's worth, sent from a thread (the socket buffer holds less), then the end.
        sender = threading.Thread(target=lambda: (a.sendall(b"x" * (3 * READ_BYTES)), a.shutdown(socket.SHUT_WR)))
        sender.start()
        got = []
        while True:
            try:
                data = read_exact_size(b.fileno(), 2 * READ_BYTES)
            except BlockingIOError:
                select.select([b], [], [], 5)
                continue
            if not data:
                break  # the end of the stream reads as b""
            assert len(data) <= READ_BYTES
            got.append(data)
        sender.join(5)
        assert b"".join(got) == b"x" * (3 * READ_BYTES)


HELD_READS = textwrap.dedent("""
    import collections, ctypes, os, sys
    from kproxy.io.reads import read_exact_size

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    r, w = os.pipe()
    os.set_blocking(r, False)
    read = (lambda: os.read(r, 256 * 1024)) if sys.argv[1] == "os.read" else (lambda: read_exact_size(r, 256 * 1024))
    block = bytearray(1 << 20)  # a large block freed once raises glibc's mmap threshold, as in a running proxy
    del block
    held = collections.deque(maxlen=100)
    start = libc.mallinfo2().arena
    for i in range(100_000):
        os.write(w, b"x" * (600 + i % 700))
        data = read()
        if i % 10 == 0:
            held.append(data)  # a read kept a while: a delayed request, a row waiting for the trace writer
    print(libc.mallinfo2().arena - start)
""")


def _heap_growth(how: str) -> int:
    out = subprocess.run([sys.executable, "-c", HELD_READS, how], capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc's mallinfo2 measures the heap")
def test_held_reads_leave_the_heap_where_it_was() -> None:
    exact = _heap_growth("exact")
    assert exact < 1_000_000, f"the heap grew {exact} bytes for 100 reads held at a time"
    # What the reads did before, on the same pattern: the heap grows past what is held.
    assert _heap_growth("os.read") > 2 * max(exact, 500_000)
