"""Request heads are bounded in size, count and time, and connections are limited.

Each test attacks a real gateway process over raw sockets and checks the refusal (a JSON error, the
connection closed), the gateway's memory (VmHWM, the peak RSS, from /proc) and that other clients are
still served.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from service.embedded.tansu import EmbeddedBroker
from tests.integration.gateway_proc import GatewayProcess

MiB = 1024 * 1024
#: the peak RSS may grow by at most this much during a 64 MiB header attack (one socket read past the
#: 16 KiB cap is buffered; the rest is discarded as it arrives)
RSS_MARGIN = 50 * MiB


@pytest.fixture(params=["httptools", "h11"])
def gw(request: pytest.FixtureRequest, tansu: EmbeddedBroker,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gw") / "gateway.log"
    with GatewayProcess(tansu.bootstrap, env={"GATEWAY_HTTP_PARSER": request.param}, log_file=log) as g:
        yield g


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"{field} missing from /proc/{pid}/status")


def _connect(gw: GatewayProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", gw.port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    out = bytearray()
    while chunk := sock.recv(65536):
        out += chunk
    return bytes(out)


def _parse(raw: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    return status, headers, orjson.loads(body)


def _send_until_answered(sock: socket.socket, prefix: bytes, total: int, chunk: bytes) -> int:
    """Send ``prefix`` then up to ``total`` bytes of ``chunk`` repeats, stopping as soon as the server
    answers (or stops reading); the number of bytes sent."""
    sock.sendall(prefix)
    sent = len(prefix)
    while sent < total:
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            break
        try:
            sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(chunk)
    return sent


def test_64mib_header_is_refused_with_431_and_memory_stays_bounded(gw: GatewayProcess) -> None:
    assert gw.proc is not None
    rss_before = _status_kb(gw.proc.pid, "VmRSS")
    # four parallel unauthenticated instance GETs (which a replica would forward) and a /healthz, each
    # with a 64 MiB header

    def attack(path: str) -> tuple[int, dict[str, str], dict[str, object], int]:
        with _connect(gw) as sock:
            sent = _send_until_answered(sock, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ".encode(),
                                        64 * MiB, b"a" * 65536)
            return (*_parse(_read_all(sock)), sent)  # read to EOF: the server closed the connection

    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(attack, ["/healthz"] + ["/consumers/g/instances/i/records"] * 4))
    for status, headers, body, sent in results:
        assert status == 431, (status, body)
        assert body["error_code"] == 43101 and "too large" in str(body["message"])
        assert headers["connection"] == "close"
        assert sent < 64 * MiB  # answered before the whole header was sent
    peak = _status_kb(gw.proc.pid, "VmHWM")
    assert peak - rss_before < RSS_MARGIN, f"peak RSS grew by {(peak - rss_before) / MiB:.1f} MiB"
    assert httpx.get(f"{gw.url}/healthz").status_code == 200  # other clients are served


def test_16mib_header_on_healthz_gets_431_json(gw: GatewayProcess) -> None:
    with _connect(gw) as sock:
        _send_until_answered(sock, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ", 16 * MiB, b"b" * 65536)
        status, headers, body = _parse(_read_all(sock))
    assert status == 431 and body["error_code"] == 43101
    assert headers["content-type"].endswith("json")


def test_100000_headers_are_refused(gw: GatewayProcess) -> None:
    with _connect(gw) as sock:
        _send_until_answered(sock, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", 100_000 * 10,
                             b"X-h: 1234\r\n" * 1000)
        status, _, body = _parse(_read_all(sock))
    assert status == 431 and body["error_code"] == 43101


def test_header_count_cap_within_the_size_cap(gw: GatewayProcess) -> None:
    """150 tiny header fields (about 1.5 KiB) pass the size cap but not the count cap (100)."""
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(150))
    with _connect(gw) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + many + b"\r\n")
        status, _, body = _parse(_read_all(sock))
    assert status == 431 and body["error_code"] == 43101 and "too many" in str(body["message"])
    # 98 fields + Host + Connection: exactly the cap, served
    fine = b"".join(b"X-%d: 1\r\n" % i for i in range(98))
    with _connect(gw) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + fine + b"\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 200")


def test_head_and_body_in_one_read_are_not_counted_as_head(gw: GatewayProcess) -> None:
    """A small head followed by a large body in the same packets: the body is not the head."""
    body = orjson.dumps({"name": "big-body", "format": "binary", "padding": "x" * (200 * 1024)})
    with _connect(gw) as sock:
        sock.sendall(b"POST /consumers/g-big HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     b"Content-Type: application/vnd.kafka.v2+json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        status, _, answer = _parse(_read_all(sock))
    assert status not in (408, 431, 503), answer  # the route's answer (the body was read), not a head refusal
    assert answer.get("error_code") not in (40801, 43101, 50304)


@pytest.fixture(params=["httptools", "h11"])
def slow_gw(request: pytest.FixtureRequest, tansu: EmbeddedBroker,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gw") / "gateway.log"
    env = {"GATEWAY_HTTP_PARSER": request.param, "GATEWAY_HTTP_HEADER_TIMEOUT_S": "2"}
    with GatewayProcess(tansu.bootstrap, env=env, log_file=log) as g:
        yield g


def _drip_head(sock: socket.socket, meanwhile: Callable[[], bool] = lambda: True) -> bytes:
    """Send a request head's first lines, then one byte a second until the gateway answers (or 15 s pass):
    the answer's bytes. ``meanwhile`` (checked each second) must hold."""
    start = time.monotonic()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    while time.monotonic() - start < 15:
        readable, _, _ = select.select([sock], [], [], 1.0)
        if readable:
            return _read_all(sock)
        try:
            sock.sendall(b"X")
        except (BrokenPipeError, ConnectionResetError):
            break
        assert meanwhile()
    return b""


def test_slow_loris_is_closed_after_the_header_timeout(slow_gw: GatewayProcess) -> None:
    with _connect(slow_gw) as sock, _connect(slow_gw) as idle:
        start = time.monotonic()
        # the attack: one header byte a second (the old server kept such a connection forever); meanwhile
        # another client is served
        answer = _drip_head(sock, lambda: httpx.get(f"{slow_gw.url}/healthz").status_code == 200)
        elapsed = time.monotonic() - start
        status, _, body = _parse(answer)
        assert status == 408 and body["error_code"] == 40801
        assert 1.5 < elapsed < 6, elapsed
        # a connection that never sent a byte is closed as well (no answer: nothing was asked)
        idle.settimeout(10)
        assert idle.recv(100) == b""
        assert time.monotonic() - start < 8


def test_a_slow_head_after_a_kept_alive_request_is_closed_after_the_header_timeout(slow_gw: GatewayProcess) -> None:
    """The header timeout also holds for the second request of a connection (the timer is armed once a head
    begins and does not complete in one read)."""
    with _connect(slow_gw) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b'"ok"}' not in first:
            chunk = sock.recv(4096)
            assert chunk, first
            first += chunk
        assert first.startswith(b"HTTP/1.1 200 ")
        start = time.monotonic()
        answer = _drip_head(sock)
        elapsed = time.monotonic() - start
        status, _, body = _parse(answer)
        assert status == 408 and body["error_code"] == 40801
        assert 1.5 < elapsed < 6, elapsed


def test_connections_over_the_limit_get_503_while_existing_ones_are_served(
        tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> None:
    log = tmp_path_factory.mktemp("gw") / "gateway.log"
    env = {"GATEWAY_HTTP_MAX_CONNECTIONS": "4", "GATEWAY_HTTP_HEADER_TIMEOUT_S": "30"}
    with GatewayProcess(tansu.bootstrap, env=env, log_file=log) as gw, httpx.Client(base_url=gw.url) as client:
        assert client.get("/healthz").status_code == 200  # one kept-alive connection
        holders = [_connect(gw) for _ in range(3)]  # with it, the limit: 4 open connections
        try:
            for _ in range(3):  # further connections are answered 503 once their request is in, then closed
                with _connect(gw) as extra:
                    extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    status, headers, body = _parse(_read_all(extra))
                assert status == 503 and body["error_code"] == 50304
                assert headers["retry-after"] == "1"
            # the established client keeps being served on its connection
            for _ in range(5):
                assert client.get("/healthz").status_code == 200
        finally:
            for s in holders:
                s.close()
        # once the holders are gone, new connections are served again (the server sees the closes
        # asynchronously: retry briefly)
        deadline = time.monotonic() + 10
        while True:
            r = httpx.get(f"{gw.url}/healthz")
            if r.status_code == 200 or time.monotonic() > deadline:
                break
        assert r.status_code == 200
