"""HOST:PORT read one way everywhere: a listener's, an upstream's, a broker helper's and the CLI's checks."""

from __future__ import annotations

import pytest

from kproxy.brokers.process import BrokerError, host_port
from kproxy.cli.options import is_host_port
from kproxy.protocol.endpoints import Endpoint, parse_endpoint


@pytest.mark.parametrize(("text", "kwargs", "expected"), [
    ("127.0.0.1:9092", {}, Endpoint("127.0.0.1", 9092)),
    (" broker-1:19092 ", {}, Endpoint("broker-1", 19092)),
    (":9092", {}, Endpoint("0.0.0.0", 9092)),  # a listener on every interface
    ("[::1]:9092", {}, Endpoint("::1", 9092)),
    ("::1:9092", {}, Endpoint("::1", 9092)),  # bare IPv6: the port follows the last colon
    ("kafka", {"default_port": 9092}, Endpoint("kafka", 9092)),
    ("127.0.0.1:0", {}, Endpoint("127.0.0.1", 0)),  # a listener on a port the system picks
    ("127.0.0.1:65535", {}, Endpoint("127.0.0.1", 65535)),
])
def test_addresses_that_read(text: str, kwargs: dict, expected: Endpoint) -> None:
    assert parse_endpoint(text, **kwargs) == expected


@pytest.mark.parametrize(("text", "kwargs", "said"), [
    ("kafka", {}, "expected HOST:PORT"),
    (":9092", {"default_host": None}, "no host"),
    ("kafka:90x2", {}, "bad port"),
    ("kafka:+9092", {}, "bad port"),
    ("kafka:-1", {}, "bad port"),
    ("kafka:", {}, "bad port"),
    ("kafka:65536", {}, "out of range"),
])
def test_addresses_that_do_not_read_say_why(text: str, kwargs: dict, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_endpoint(text, **kwargs)


def test_an_address_to_connect_to_needs_a_host_and_a_port() -> None:
    assert host_port("[::1]:9092") == ("::1", 9092)
    for text in (":9092", "kafka", "kafka:99999"):
        with pytest.raises(BrokerError, match="is not HOST:PORT"):
            host_port(text)


@pytest.mark.parametrize(("text", "ok"), [
    ("127.0.0.1:9092", True), ("kafka:9092", True), ("[::1]:9092", True),
    ("a:9092,b:9092", False),  # one address: the proxy learns the others from its metadata
    ("kafka:0", False), (":9092", False), ("kafka", False), ("kafka:70000", False),
])
def test_the_cli_takes_one_bootstrap_address(text: str, ok: bool) -> None:
    assert is_host_port(text) is ok
