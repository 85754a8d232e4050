"""A client connection's bound on the requests the proxy holds for it.

The proxy holds a request from its arrival until its answer has gone back
to the client: while the broker works on it, while a rule delays or holds
it, and, answered, while it waits for an earlier request's turn (answers go
back in request order). At `--max-outstanding-requests` held on one
connection its request pump reads no further until one leaves, as a broker
reads a connection's next request only when it has answered the last. The
client's requests wait in its socket: nothing is dropped or reordered.

Each held request leaves by its answer, a rule's timer, or the connection's
close. A request a rule dropped, and every answer behind it, leave only at
the close, which comes when the client gives up on it: so a paused
connection watches for its client's hang-up, which would otherwise wait
unread behind the requests sent before it. If the request at the head of
the connection can never be answered on it (dropped, or held for a ghost
delivery), no later answer can reach the client either, and the
connection closes at once: the requests it had not read go with it, as
with a broker that had not read them (reading them on would only make the
broker work for answers thrown away, all at once on every connection the
fault stopped). Otherwise a hang-up ends the pause for good: what the
client sent before it is read and forwarded as without the bound, and a
client that only half-closed gets its answers. A hold released by a
request the client has yet to send (its retry, its next transaction's
records) must see that request arrive: while one waits, no connection
pauses. docs/reliability.md says why the bound is what it is.
"""

from __future__ import annotations

import logging
import select
import sys
from typing import Any

import trio

from kproxy.io import tls
from kproxy.io.errors import ConnectionClosed

# kproxy.io.connection.ClientConnection, which imports this module.
ClientConnection = Any

log = logging.getLogger("kproxy.conn")

# How often a paused connection looks whether its client hung up.
HANGUP_POLL_SECONDS = 0.2
# POLLRDHUP (Linux): the peer closed its side, though what it sent before is still unread.
# POLLHUP and POLLERR (a reset) are reported without being asked for.
_HANGUP_EVENTS = getattr(select, "POLLRDHUP", 0)
# What releases a hold when a request arrives (kproxy.pipeline.holds).
_RELEASED_BY_ARRIVAL = ("client_retry", "next_txn_records")


def limit(configured: int) -> int:
    """The bound a connection compares with (0 configured: none)."""
    return configured or sys.maxsize


def client_hung_up(sock: trio.socket.SocketType | tls.TlsSocket) -> bool:
    """Whether the peer has closed or reset the connection, though what it sent before is still unread."""
    raw = sock.sock if type(sock) is tls.TlsSocket else sock
    try:
        fd = raw.fileno()
    except OSError:
        return True
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, _HANGUP_EVENTS)
    return bool(poller.poll(0))


def never_answered(ex: Any) -> bool:
    """Whether a request can never be answered on its client's connection (a rule dropped it, or holds it for a ghost)."""
    if ex.outcome == "dropped":
        return ex.response_frame is None
    return ex.outcome == "held" and getattr(ex.decision, "ghost", False)


def may_pause(conn: ClientConnection) -> bool:
    if conn.hung_up:
        return False
    entries = conn.proxy.pipeline.holds.entries
    return not entries or all(entry.release_on not in _RELEASED_BY_ARRIVAL for entry in entries)


async def wait_for_room(conn: ClientConnection) -> None:
    """Read nothing more from the client until fewer than its bound of requests are held, or it hangs up."""
    conn.paused = True
    # The sweep's read timeout is for a client that stalls, not for a proxy that stopped reading.
    conn.frame_started = None
    log.debug("conn %d from %s: %d requests held; reading paused", conn.conn_id, conn.client_addr, len(conn.order))
    try:
        while len(conn.order) >= conn.max_outstanding:
            if client_hung_up(conn.client):
                if never_answered(conn.order[0]):
                    raise ConnectionClosed(
                        "client_closed", "client hung up behind a request that will never be answered on this "
                                         "connection; closing without reading the requests it sent after the bound")
                conn.hung_up = True
                return
            if not may_pause(conn):
                return
            conn.room = room = trio.Event()
            with trio.move_on_after(HANGUP_POLL_SECONDS):
                await room.wait()
    finally:
        conn.room = None
        conn.paused = False
