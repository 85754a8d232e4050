"""A network address, HOST:PORT, and the one reading of its text.

A module of its own, beside the protocol modules that use it (kproxy.protocol.broker_addresses),
so that what only reads an address (the broker helpers, the CLI's checks, the bench) imports
nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


#: parse_endpoint's default host: a listener's "all interfaces".
ALL_INTERFACES = "0.0.0.0"


def parse_endpoint(text: str, default_port: int | None = None, default_host: str | None = ALL_INTERFACES) -> Endpoint:
    """HOST:PORT, the one reading of an address everywhere (IPv6 as [::1]:PORT, or bare when the
    port follows the last colon). Without a port, `default_port` when given; without a host,
    `default_host` when given (None: a host is required, as for an address to connect to). The
    port is decimal digits, 0 to 65535. ValueError says what is wrong."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        if default_port is None:
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        host, port = text.strip(), str(default_port)
    host = host.strip("[]")
    if not host:
        if default_host is None:
            raise ValueError(f"no host in {text!r} (expected HOST:PORT)")
        host = default_host
    if not port.isdigit():
        raise ValueError(f"bad port in {text!r}")
    number = int(port)
    if number > 65535:
        raise ValueError(f"port out of range in {text!r}")
    return Endpoint(host, number)
