"""TLS on both sides of the proxy (docs/security.md).

Python's `ssl` does the cryptography, trio's `SSLStream` the I/O; this
module only builds the contexts from the files `kproxy run` names, runs the
handshakes, and gives the data path a TLS connection that reads and writes
like the plain sockets it already moves bytes between (`recv`, `send_all`,
`close`, `shutdown`). The proxy must decrypt: it decodes frames to number
transactions and apply rules, so it cannot pass TLS bytes through unread.

A handshake that fails costs that one connection: a `TlsHandshakeError`
with a short, bounded reason for the metric and the peer's own words for
the log line.
"""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import trio

from kproxy.io.reads import read_exact_size
from kproxy.obs.metrics import TLS_HANDSHAKE_REASONS as HANDSHAKE_REASONS  # noqa: F401  (the metric's label set)


class TlsConfigError(ValueError):
    """A certificate, key or CA file kproxy cannot use; the message names the file."""


class TlsHandshakeError(OSError):
    """A TLS handshake failed; `reason` is one of HANDSHAKE_REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class UpstreamTls:
    """How the proxy opens TLS to brokers."""

    context: ssl.SSLContext
    # Each connection names the broker's advertised host (SNI and verification).
    check_hostname: bool = True


def _load_chain(context: ssl.SSLContext, cert: Path, key: Path, what: str) -> None:
    for path in (cert, key):
        if not path.is_file():
            raise TlsConfigError(f"{path}: no such file ({what})")
    try:
        context.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"{cert}, {key}: not a PEM certificate chain and its private key ({what}): {exc.reason or exc}"
        ) from None
    except OSError as exc:
        raise TlsConfigError(f"{cert}, {key}: cannot read ({what}): {exc.strerror or exc}") from None


def _load_ca(context: ssl.SSLContext, ca: Path, what: str) -> None:
    if not ca.is_file():
        raise TlsConfigError(f"{ca}: no such file ({what})")
    try:
        context.load_verify_locations(cafile=str(ca))
    except ssl.SSLError as exc:
        raise TlsConfigError(f"{ca}: no PEM certificate in it ({what}): {exc.reason or exc}") from None
    except OSError as exc:
        raise TlsConfigError(f"{ca}: cannot read ({what}): {exc.strerror or exc}") from None


def server_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """The context of every client listener: this certificate, and client certificates required if client_ca."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert, key, "--tls-cert/--tls-key")
    if client_ca is not None:
        _load_ca(context, client_ca, "--tls-client-ca")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    ca: Path | None = None, cert: Path | None = None, key: Path | None = None, check_hostname: bool = True
) -> UpstreamTls:
    """TLS towards brokers: verified against ca (the system's CAs without it), with an optional client certificate."""
    if (cert is None) != (key is None):
        raise TlsConfigError("--upstream-cert and --upstream-key go together (a client certificate and its key)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        _load_ca(context, ca, "--upstream-ca")
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if cert is not None and key is not None:
        _load_chain(context, cert, key, "--upstream-cert/--upstream-key")
    return UpstreamTls(context, check_hostname)


def classify(exc: BaseException) -> tuple[str, str]:
    """(reason, message) for a failed handshake."""
    if isinstance(exc, trio.TooSlowError):
        return "timeout", "the TLS handshake timed out"
    cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None else exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        text = (cause.verify_message or str(cause)).rstrip(".")
        reason = "hostname" if "mismatch" in text.lower() else "certificate"
        return reason, f"certificate verification failed: {text}"
    if isinstance(cause, ssl.SSLError):
        code = cause.reason or ""
        text = f"{code or cause}"
        if code in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNSUPPORTED_PROTOCOL",
                    "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNEXPECTED_RECORD"):
            return "not_tls", f"the peer does not speak TLS ({text})"
        if code in ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED", "NO_CERTIFICATE_RETURNED"):
            return "certificate", f"the peer's certificate is missing or not trusted ({text})"
        if "ALERT" in code:
            return "peer_refused", f"the peer refused the handshake ({text})"
        if isinstance(cause, ssl.SSLEOFError) or "EOF" in code:
            return "closed", "the peer closed the connection during the TLS handshake"
        return "protocol", f"TLS error ({text})"
    if isinstance(cause, (trio.BrokenResourceError, ConnectionError, EOFError)):
        return "closed", "the peer closed the connection during the TLS handshake"
    return "protocol", f"TLS handshake failed: {cause}"


# The transport's reads: as large as the plaintext path's, so one read brings many TLS records.
TRANSPORT_RECV_BYTES = 256 * 1024
# Transport calls in a row that did not wait, before it lets other tasks run.
YIELD_EVERY_CALLS = 16


class SocketTransport(trio.abc.HalfCloseableStream):
    """The byte stream under SSLStream: the kernel called directly, trio only to wait.

    trio's SocketStream passes every read and write through the scheduler
    (an epoll call each); with TLS records of 16 KiB that was three trips
    per record. This calls the kernel as the plaintext path does
    (kproxy/io/net.py) and yields every few calls that did not wait, so a
    busy connection neither starves the others nor blocks cancellation.
    """

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.socket = sock
        self._streak = 0

    async def _maybe_yield(self) -> None:
        self._streak += 1
        if self._streak >= YIELD_EVERY_CALLS:
            self._streak = 0
            await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        size = max_bytes or TRANSPORT_RECV_BYTES
        sock = self.socket
        while True:
            try:
                data = read_exact_size(sock.fileno(), size)
            except BlockingIOError:
                self._streak = 0
                try:
                    await trio.lowlevel.wait_readable(sock)
                except (trio.ClosedResourceError, OSError) as exc:
                    raise trio.ClosedResourceError("the connection was closed") from exc
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(str(exc)) from exc
            await self._maybe_yield()
            return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        sock = self.socket
        view = memoryview(data)
        while view:
            try:
                sent = os.write(sock.fileno(), view)
            except BlockingIOError:
                self._streak = 0
                try:
                    await trio.lowlevel.wait_writable(sock)
                except (trio.ClosedResourceError, OSError) as exc:
                    raise trio.ClosedResourceError("the connection was closed") from exc
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(str(exc)) from exc
            view = view[sent:]
        await self._maybe_yield()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self.socket)

    async def send_eof(self) -> None:
        self.socket.shutdown(socket.SHUT_WR)
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self.socket.close()
        await trio.lowlevel.checkpoint()


class TlsSocket:
    """A TLS connection with the methods of a socket that the data path uses.

    One task may receive while another sends (trio's SSLStream allows
    exactly that); the connection's locks keep it to one sender. Failures
    surface as OSError, as a socket's do, so the pumps need no TLS case.
    """

    __slots__ = ("stream", "sock")

    def __init__(self, stream: trio.SSLStream[SocketTransport], sock: trio.socket.SocketType) -> None:
        self.stream = stream
        self.sock = sock

    async def recv(self, size: int) -> bytes:
        """Up to `size` bytes: every TLS record already received, not just the first.

        SSLStream returns one record per call (at most 16 KiB, and clients
        such as librdkafka write records of a few hundred bytes), so a
        Produce would otherwise cross the proxy in hundreds of reads and
        writes per MiB. Records already received are read on; no new read is
        waited for, except the rest of a record that arrived in part (its
        sender wrote it whole, so the rest is on its way). `_buffered` reads
        SSLStream's state (its own attributes: if a trio release renames
        them, one record per call again, nothing worse).
        """
        data = await self._receive(size)
        if len(data) >= size or not data or not self._buffered():
            return data
        parts = [data]
        got = len(data)
        while got < size and self._buffered():
            more = await self._receive(size - got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def _buffered(self) -> bool:
        stream = self.stream
        try:
            return stream._ssl_object.pending() > 0 or stream._incoming.pending > 0  # type: ignore[attr-defined]
        except AttributeError:
            return False

    async def _receive(self, size: int) -> bytes:
        try:
            return await self.stream.receive_some(size)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            cause = exc.__cause__
            if isinstance(cause, ssl.SSLError) and "EOF" in (cause.reason or type(cause).__name__):
                return b""  # a peer that closed TCP without close_notify, as Kafka clients do
            raise OSError(f"TLS connection failed: {cause or exc}") from None

    async def send_all(self, data: bytes | memoryview) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise OSError(f"TLS connection failed: {exc.__cause__ or exc}") from None

    def close(self) -> None:
        # Without close_notify: Kafka clients and brokers end with a TCP close,
        # and an awaited goodbye would hold up every connection's cleanup.
        self.sock.close()

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def fileno(self) -> int:
        return self.sock.fileno()

    def getpeercert(self) -> dict | None:
        return self.stream.getpeercert()

    def __enter__(self) -> TlsSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _handshake(
    sock: trio.socket.SocketType, context: ssl.SSLContext, server_side: bool, server_hostname: str | None, timeout: float
) -> TlsSocket:
    stream = trio.SSLStream(
        SocketTransport(sock), context, server_side=server_side, server_hostname=server_hostname,
        https_compatible=True,  # a peer may close without close_notify; that is not an attack on Kafka framing
    )
    try:
        with trio.fail_after(timeout):
            await stream.do_handshake()
    except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as exc:
        sock.close()
        reason, message = classify(exc)
        raise TlsHandshakeError(reason, message) from None
    return TlsSocket(stream, sock)


async def accept(sock: trio.socket.SocketType, context: ssl.SSLContext, timeout: float) -> TlsSocket:
    """Server side of a client's handshake; TlsHandshakeError (the socket closed) when it fails."""
    return await _handshake(sock, context, True, None, timeout)


async def connect(sock: trio.socket.SocketType, tls: UpstreamTls, host: str, timeout: float) -> TlsSocket:
    """Client side of the handshake with a broker, host as SNI and as the name its certificate must carry."""
    return await _handshake(sock, tls.context, False, host, timeout)


def looks_like_tls(data: bytes) -> bool:
    """Does a plaintext listener's first read start with a TLS handshake record (a TLS client)?"""
    return len(data) >= 3 and data[0] == 0x16 and data[1] == 0x03 and data[2] <= 0x04
