"""Socket reads that allocate what arrived, not what was asked for."""

from __future__ import annotations

import os
import threading

# The largest read: the data path's and the TLS transport's (kproxy.io.net.RECV_BYTES, tls.TRANSPORT_RECV_BYTES).
READ_BYTES = 256 * 1024

# Every read lands in a buffer kept for it and leaves as a bytes object of
# exactly its length. os.read(fd, 256 KiB) allocates 256 KiB and shrinks the
# block to what arrived, leaving the small block where the large one began:
# the reads a connection keeps for a while (a delayed or held request, a row
# waiting for the trace writer) pinned gaps that no later 256 KiB read fitted
# into, so the heap grew for as long as the proxy ran. Measured in a soak
# (docs/reliability.md): the heap's free bytes went from 4 to 17 MB in three
# minutes while its bytes in use stayed at 14 MB; with exact reads they stay
# near 1 MB. It is cheaper too: no 256 KiB block to map or carve per read.
# One buffer per thread serves every read of that thread's event loop:
# nothing awaits between the read and the copy.
_scratch = threading.local()


def read_exact_size(fd: int, size: int) -> bytes:
    """Up to `size` bytes from `fd` (at most READ_BYTES), allocated at the size that arrived.

    Raises what os.read raises (BlockingIOError when nothing is waiting).
    """
    try:
        view = _scratch.view
    except AttributeError:
        view = _scratch.view = memoryview(bytearray(READ_BYTES))
    n = os.readv(fd, (view[:size] if size < READ_BYTES else view,))
    return view[:n].tobytes()
