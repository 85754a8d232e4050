"""The admin API of a real `kproxy run`: malformed bodies change nothing, foreign
pages and hosts are refused, a token guards it beyond loopback, and without one
the proxy will not expose it (docs/security.md)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import httpx
import pytest
import trio
from click.testing import CliRunner
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from starlette.applications import Starlette

from kproxy.cli import main
from kproxy.io.admin_body import DrainUnreadBody, RefuseOversizedBody
from kproxy.faults.limits import MAX_DOCUMENT_BYTES

DROP = {"action": {"type": "drop"}}


def rules_answer(proxy, **headers: str) -> httpx.Response:  # noqa: ANN001
    return httpx.get(f"{proxy.admin_url}/rules", headers=headers, timeout=5)


def rule_ids(proxy, **headers: str) -> list[str]:  # noqa: ANN001
    answer = rules_answer(proxy, **headers)
    assert answer.status_code == 200, answer.text
    return [r["id"] for r in answer.json()["rules"]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- bodies ------------------------------------------------------------------------

MALFORMED_BODIES = {
    "Infinity": (b'{"action": {"type": "delay", "ms": Infinity}}', 400, "a number must be finite"),
    "NaN probability": (b'{"match": {"probability": NaN}, "action": {"type": "drop"}}', 400, "a number must be finite"),
    "overflow to infinity": (b'{"action": {"type": "delay", "ms": 1e999}}', 400, "a number must be finite"),
    "delay of a day": (b'{"action": {"type": "delay", "ms": 86400000}}', 400, "less than or equal to 3600000"),
    "100k-deep list": (b"[" * 100_000 + b"]" * 100_000, 400, "nests deeper than 32 levels"),
    "100k-deep object": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 400, "nests deeper than 32 levels"),
    "not UTF-8": (b'{"action": {"type": "\xff"}}', 400, "not JSON"),
    "50 MB": (b" " * (50 * 1024 * 1024), 413, f"larger than {MAX_DOCUMENT_BYTES} bytes"),
}


def test_malformed_bodies_get_4xx_and_change_nothing(proxy_factory) -> None:  # noqa: ANN001
    proxy = proxy_factory()
    url = f"{proxy.admin_url}/rules/x"
    for name, (body, status, fragment) in MALFORMED_BODIES.items():
        answer = httpx.put(url, content=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert answer.status_code == status, f"{name}: {answer.status_code} {answer.text[:300]}"
        assert fragment in answer.json()["error"], f"{name}: {answer.text[:300]}"
        assert rule_ids(proxy) == [], name
    # A body sent in chunks, without a length to refuse it by, is cut off at the limit too.
    chunks = (b" " * (1024 * 1024) for _ in range(50))
    answer = httpx.put(url, content=chunks, headers={"Content-Type": "application/json"}, timeout=30)
    assert answer.status_code == 413
    assert rule_ids(proxy) == []
    # And the API still works.
    assert httpx.put(url, json=DROP, timeout=5).status_code == 200
    assert rule_ids(proxy) == ["x"]
    assert proxy.alive()


FIFTY_MB = 50 * 1024 * 1024


def _urllib_put(url: str, body: bytes, **headers: str) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=body, method="PUT", headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read()


def _raw_exchange(port: int, request: bytes) -> bytes:
    """Send a request whole, as urllib does, then read until the server closes.

    Had the server closed with the body unread, the connection would end in a reset: sendall or recv
    would raise ConnectionResetError or BrokenPipeError, with the answer lost."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
        return received


def test_an_oversized_body_gets_413_to_any_client_and_a_clean_close(proxy_factory, tmp_path: Path) -> None:  # noqa: ANN001
    proxy = proxy_factory()
    url = f"{proxy.admin_url}/rules/x"
    big = b" " * FIFTY_MB
    expected = f"larger than {MAX_DOCUMENT_BYTES} bytes"
    # urllib writes the whole body before it reads a byte of the answer.
    status, headers, text = _urllib_put(url, big)
    assert status == 413 and expected in json.loads(text)["error"]
    assert headers.get("Connection") == "close"
    # curl, with its Expect: 100-continue and without it.
    body_file = tmp_path / "big.json"
    body_file.write_bytes(big)
    for expect in ("Expect: 100-continue", "Expect:"):
        done = subprocess.run(["curl", "-sS", "-X", "PUT", "-H", expect, "-H", "Content-Type: application/json",
                               "--data-binary", f"@{body_file}", "-w", "\n%{http_code}", url],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (expect, done.stderr)
        answer, code = done.stdout.rsplit("\n", 1)
        assert code == "413" and expected in json.loads(answer)["error"], (expect, done.stdout[:300])
    assert httpx.put(url, content=big, timeout=30).status_code == 413
    # A plain socket that sends everything first: the answer, then an orderly end of the connection.
    head = (f"PUT /rules/x HTTP/1.1\r\nHost: 127.0.0.1:{proxy.admin_port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {FIFTY_MB}\r\n\r\n").encode()
    received = _raw_exchange(proxy.admin_port, head + big)
    assert received.startswith(b"HTTP/1.1 413 ") and expected.encode() in received
    assert rule_ids(proxy) == [] and proxy.alive()
    assert httpx.put(url, json=DROP, timeout=5).status_code == 200


async def test_a_client_that_stops_sending_its_body_is_cut_off_after_a_pause() -> None:
    """The drain after an early answer is bounded: a client that declares 50 MB and sends a little is
    answered at once, and the connection closed after the pause the drain allows."""
    app = DrainUnreadBody(RefuseOversizedBody(Starlette()), drain_idle_seconds=0.3)
    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    async with trio.open_nursery() as nursery:
        (bound,) = await nursery.start(hypercorn_serve, app, config)
        port = int(bound.rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"PUT /rules/x HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  + f"Content-Length: {FIFTY_MB}\r\n\r\n".encode() + b" " * 65536)
            received, answered = b"", None
            started = trio.current_time()
            with trio.fail_after(10):
                while chunk := await stream.receive_some(65536):
                    received += chunk
                    if answered is None and b"\r\n\r\n" in received:
                        answered = trio.current_time() - started
            closed = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert received.startswith(b"HTTP/1.1 413 ")
    assert answered is not None and answered < 0.3 <= closed < 5, (answered, closed)


def test_a_refusal_before_the_body_is_read_reaches_a_client_still_sending(proxy_factory, tmp_path: Path) -> None:  # noqa: ANN001
    """401 without the token, for a body under the limit but far larger than a socket buffer: urllib hears it."""
    token_file = tmp_path / "admin-token"
    proxy = proxy_factory("--admin-token-file", str(token_file), "--generate-admin-token")
    status, _, text = _urllib_put(f"{proxy.admin_url}/rules/x", b" " * (MAX_DOCUMENT_BYTES - 1))
    assert status == 401 and "bearer token" in json.loads(text)["error"]
    # Too large and without the token: who may call is decided first.
    status, _, _ = _urllib_put(f"{proxy.admin_url}/rules/x", b" " * FIFTY_MB)
    assert status == 401
    token = token_file.read_text().strip()
    status, _, _ = _urllib_put(f"{proxy.admin_url}/rules/x", b" " * FIFTY_MB, Authorization=f"Bearer {token}")
    assert status == 413


# -- Host and Origin ----------------------------------------------------------------


def test_foreign_host_or_origin_is_refused_on_loopback(proxy_factory) -> None:  # noqa: ANN001
    proxy = proxy_factory()
    own = f"127.0.0.1:{proxy.admin_port}"
    refused = [
        # a DNS-rebinding page: its own name, resolved to 127.0.0.1, and so its own origin
        {"Host": f"evil.example:{proxy.admin_port}", "Origin": f"http://evil.example:{proxy.admin_port}"},
        {"Host": "evil.example"},
        # a cross-site page calling 127.0.0.1 directly
        {"Origin": "http://evil.example"},
        {"Origin": f"http://localhost:{proxy.admin_port + 1}"},  # another local service is another site
        {"Origin": "null"},  # sandboxed frames and file:// pages
    ]
    for headers in refused:
        for method, path in (("POST", "/rules/reset"), ("PUT", "/rules/x"), ("GET", "/rules"), ("GET", "/metrics")):
            answer = httpx.request(method, f"{proxy.admin_url}{path}", headers=headers, json=DROP, timeout=5)
            assert answer.status_code == 403, f"{method} {path} {headers}: {answer.status_code}"
            assert "error" in answer.json()
    assert rule_ids(proxy) == []  # no refused PUT installed anything
    # Its own origin, loopback names, and clients that send no Origin (curl, httpx, Prometheus) are served.
    accepted = [{}, {"Origin": f"http://{own}"}, {"Host": f"localhost:{proxy.admin_port}"},
                {"Host": f"[::1]:{proxy.admin_port}"}]
    for headers in accepted:
        answer = httpx.post(f"{proxy.admin_url}/rules/reset", headers=headers, timeout=5)
        assert answer.status_code == 200, f"{headers}: {answer.text}"


# -- the token -------------------------------------------------------------------------


def test_non_loopback_admin_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    for admin in (f"0.0.0.0:{free_port()}", f"[::]:{free_port()}", f"kproxy.example:{free_port()}"):
        done = subprocess.run(
            [sys.executable, "-m", "kproxy", "run", "--upstream", "127.0.0.1:1", "--listen", f"127.0.0.1:{free_port()}",
             "--admin", admin],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith("Error: the admin API on "), done.stderr
        assert "--admin-token-file" in done.stderr and "Traceback" not in done.stderr


def test_a_token_file_that_cannot_serve_is_refused_at_start(tmp_path: Path) -> None:
    weak = tmp_path / "weak"
    weak.write_text("secret\n")
    for extra in (["--admin-token-file", str(weak)], ["--admin-token-file", str(tmp_path / "missing")],
                  ["--generate-admin-token"]):
        done = subprocess.run(
            [sys.executable, "-m", "kproxy", "run", "--upstream", "127.0.0.1:1", "--listen", f"127.0.0.1:{free_port()}",
             "--admin", f"0.0.0.0:{free_port()}", *extra],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode in (1, 2), done.stderr
        assert done.stderr.startswith(("Error: ", "Usage: ")) and "Traceback" not in done.stderr, done.stderr


def test_the_token_guards_the_rules_api_but_not_metrics_and_health(proxy_factory, tmp_path: Path) -> None:  # noqa: ANN001
    token_file = tmp_path / "admin-token"
    proxy = proxy_factory("--admin-token-file", str(token_file), "--generate-admin-token", admin_bind="0.0.0.0")
    token = token_file.read_text().strip()
    assert len(token) >= 40 and stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    assert proxy.log_text().count(token) == 1  # printed once, at start

    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": f"Basic {token}"}):
        answer = rules_answer(proxy, **headers)
        assert answer.status_code == 401 and answer.headers["WWW-Authenticate"] == "Bearer", headers
        assert httpx.put(f"{proxy.admin_url}/rules/x", json=DROP, headers=headers, timeout=5).status_code == 401
        assert httpx.get(f"{proxy.admin_url}/txns", headers=headers, timeout=5).status_code == 401
    bearer = {"Authorization": f"Bearer {token}"}
    assert rule_ids(proxy, **bearer) == []  # nothing got in without the token
    assert httpx.put(f"{proxy.admin_url}/rules/x", json=DROP, headers=bearer, timeout=5).status_code == 200
    # Beyond loopback the listener has no fixed name: the token, not the Host, keeps strangers out ...
    assert rule_ids(proxy, Host="kproxy:19080", **bearer) == ["x"]
    # ... but a page of another site is refused even with it.
    assert rules_answer(proxy, Origin="http://evil.example", **bearer).status_code == 403
    # Monitoring needs no token.
    assert httpx.get(f"{proxy.admin_url}/healthz", timeout=5).status_code == 200
    assert "kproxy_rule_reloads_total" in httpx.get(f"{proxy.admin_url}/metrics", timeout=5).text

    # The command-line client reads the same file.
    runner = CliRunner()
    admin = f"127.0.0.1:{proxy.admin_port}"
    listed = runner.invoke(main, ["rules", "list", "--admin", admin, "--admin-token-file", str(token_file)])
    assert listed.exit_code == 0 and "x " in listed.stdout, listed.output
    from_env = runner.invoke(main, ["rules", "disable", "x", "--admin", admin],
                             env={"KPROXY_ADMIN_TOKEN_FILE": str(token_file)})
    assert from_env.exit_code == 0 and from_env.stdout == "disabled: x\n", from_env.output
    without = runner.invoke(main, ["rules", "list", "--admin", admin])
    assert without.exit_code == 1 and "needs its bearer token" in without.stderr, without.output


@pytest.mark.parametrize("command", [["list"], ["reset"], ["reload"], ["enable", "x"], ["delete", "x"]])
def test_rules_client_reports_an_unreadable_token_file(command: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["rules", *command, "--admin-token-file", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert "cannot read the admin token file" in result.stderr and "Traceback" not in result.output
