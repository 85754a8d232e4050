"""Can the proxy reach a broker the way it forwards to it? The probe behind /readyz.

Plaintext: a bare TCP connect, which is all a plaintext forward needs before
its first request. With upstream TLS a TCP connect proves nothing: a broker
whose certificate the proxy rejects (wrong CA, a name it does not carry), or
that refuses the proxy's client certificate, accepts TCP all the same, and
every client connection through the proxy then fails. So a TLS probe opens
the connection the data path opens (net.connect: the broker's advertised
name as SNI and as the name verified, the same context) and then asks
ApiVersions, which every broker answers before authentication: under TLS 1.3
a broker refuses a client certificate only after the handshake, with an
alert that ends the first read.
"""

from __future__ import annotations

import socket
import struct

import trio

from kproxy.io import net
from kproxy.io.tls import TlsHandshakeError, UpstreamTls
from kproxy.protocol.codec import encode_request
from kproxy.protocol.broker_addresses import Endpoint

# How long a broker may take to accept a TCP connection, and (TLS) to finish the
# handshake and answer ApiVersions: a handshake costs round trips and CPU on both sides.
PROBE_TIMEOUT = 0.5
TLS_PROBE_TIMEOUT = 2.0

_CORRELATION_ID = 0x6B70726F  # "kpro": the probe's own connection, never a client's


def _api_versions_frame() -> bytes:
    from kio.schema.api_versions.v0.request import ApiVersionsRequest

    return encode_request(ApiVersionsRequest(), _CORRELATION_ID, "kproxy-readiness")


async def probe(endpoint: Endpoint, tls: UpstreamTls | None) -> str | None:
    """None when the broker at `endpoint` can be reached as the proxy forwards to it, else why not."""
    if tls is None:
        return await _tcp_probe(endpoint, PROBE_TIMEOUT)
    return await _tls_probe(endpoint, tls, TLS_PROBE_TIMEOUT)


async def _tcp_probe(endpoint: Endpoint, timeout: float) -> str | None:
    with trio.move_on_after(timeout):
        try:
            infos = await trio.socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            return f"cannot resolve {endpoint.host}: {exc.strerror or exc}"
        last = "no address"
        for family, type_, proto, _, addr in infos:
            sock = trio.socket.socket(family, type_, proto)
            with sock:
                try:
                    await sock.connect(addr)
                except OSError as exc:
                    last = exc.strerror or str(exc)
                    continue
                return None
        return f"no TCP connection: {last}"
    return f"no TCP connection within {timeout:g}s"


async def _tls_probe(endpoint: Endpoint, tls: UpstreamTls, timeout: float) -> str | None:
    with trio.move_on_after(timeout):
        try:
            sock = await net.connect(endpoint.host, endpoint.port, timeout, tls)
        except TlsHandshakeError as exc:
            return f"TLS handshake failed: {exc}"
        except (OSError, trio.TooSlowError) as exc:
            return f"no TCP connection: {getattr(exc, 'strerror', None) or exc or 'timed out'}"
        with sock:
            try:
                await net.send_all(sock, _api_versions_frame())
                head = await _read(sock, 8)
            except OSError as exc:
                return f"the broker ended the TLS connection: {exc}"
            if head is None:
                return "the broker closed the TLS connection before answering ApiVersions"
            if struct.unpack_from(">i", head, 4)[0] != _CORRELATION_ID:
                return "the broker answered with something that is not Kafka"
            return None
    return f"no TLS connection and ApiVersions answer within {timeout:g}s"


async def _read(sock: object, size: int) -> bytes | None:
    """Exactly `size` bytes, or None when the peer closes first."""
    data = b""
    while len(data) < size:
        more = await sock.recv(size - len(data))  # type: ignore[attr-defined]
        if not more:
            return None
        data += more
    return data
