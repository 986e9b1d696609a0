"""Answers held for clients that do not read them stay in the memory budget; records per produce request are capped.

A real gateway with ``GATEWAY_MEMORY_BUDGET_BYTES`` lowered to ``BUDGET`` and a short
``GATEWAY_HTTP_SEND_TIMEOUT_S``:

- clients that ask for large range pages (or poll consumer instances with large answers) and never read their
  sockets: the answer stays charged to the budget until it left the process, so the others are refused
  503/50305 instead of being rendered; peak RSS grows by at most the budget plus ``MARGIN`` (before: every page
  was rendered and parked in its connection's write buffer, +150 MB for 20 clients and 8 MiB pages); a client
  with small requests is still served; the connections that do not drain are closed after the send timeout and
  their charge is given back;
- a 1 MB produce body of ~340k ``{}`` records is refused 413/41303 whole: nothing written to the topic, no
  answer of 340k offsets built (before: all written, a 21 MB answer, +73 MB peak).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from service.client.client import KafkaClient
from service.embedded.tansu import EmbeddedBroker
from service.protocol import records as R
from tests.integration.gateway_proc import GatewayProcess
from tests.security.raw_kafka import produce_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MiB = 1024 * 1024
BUDGET = 32 * MiB
MARGIN = 40 * MiB  # allocator slack, the interpreter's own growth, sockets, the neighbour's reads
SEND_TIMEOUT_S = 4.0
TOPIC = "outbudget-big"
SMALL = "outbudget-small"
CAP_TOPIC = "outbudget-cap"
BATCHES = 24  # of 1 MiB each
RECORD = 64 * 1024
ATTACKERS = 20
POLLERS = 12
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BINARY = {"Accept": "application/vnd.kafka.binary.v2+json"}


async def _setup(bootstrap: str) -> None:
    client = KafkaClient(bootstrap)
    try:
        await client.create_topics({TOPIC: 1, SMALL: 1, CAP_TOPIC: 1})
        await client.refresh_metadata({TOPIC, SMALL, CAP_TOPIC})
        node = client.metadata.leader(TOPIC, 0)
        assert node is not None
        conn = await client.connection(node).get()
        for i in range(BATCHES):
            batch = R.build_batch([(None, bytes([i % 251]) * RECORD) for _ in range(MiB // RECORD)])
            resp = await conn.send(produce_request(TOPIC, 0, batch), 9)
            assert resp.responses[0].partition_responses[0].error_code == 0
        small = R.build_batch([(None, b"s-%d" % i) for i in range(10)])
        resp = await conn.send(produce_request(SMALL, 0, small), 9)
        assert resp.responses[0].partition_responses[0].error_code == 0
    finally:
        await client.close()


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    asyncio.run(_setup(tansu.bootstrap))
    log = Path(tmp_path_factory.mktemp("outbudget")) / "gateway.log"
    g = GatewayProcess(tansu.bootstrap, log_file=log, env={
        # a wait long enough for every page to get its turn before the fix (each was rendered, written, its
        # charge released at once): the attack then grew the process by every page
        "GATEWAY_MEMORY_BUDGET_BYTES": str(BUDGET), "GATEWAY_MEMORY_WAIT_S": "5",
        "GATEWAY_HTTP_SEND_TIMEOUT_S": str(SEND_TIMEOUT_S),
        "GATEWAY_DEFAULT_REQUESTS_PER_SECOND": "0", "GATEWAY_DEFAULT_MAX_RANGE_READS": "0",
        "GATEWAY_DEFAULT_MAX_CONCURRENT_POLLS": "0"})
    with g:
        yield g


def _status(g: GatewayProcess, key: str) -> int:
    assert g.proc is not None
    for line in Path(f"/proc/{g.proc.pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key}")


def _metric(g: GatewayProcess, name: str, label: str) -> float:
    text = httpx.get(f"{g.url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{kind="{label}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0  # (a kind the gateway does not know: nothing charged under it)


def _no_reader(g: GatewayProcess, target: str) -> socket.socket:
    """A connection that sends one GET and never reads (a small receive buffer: the kernel holds little)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", g.port))
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{g.port}\r\n"
              "Accept: application/vnd.kafka.binary.v2+json\r\n\r\n".encode())
    return s


def _head(s: socket.socket) -> tuple[int, int, int]:
    """Read only the response head (a few bytes more at most): status, content length, body bytes read."""
    s.settimeout(60)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(256)
        assert chunk, "the gateway closed the connection before answering"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return status, length, len(rest)


def _read_to_end(s: socket.socket, length: int, have: int) -> int:
    """Read the rest of the body, or until the gateway closed the connection: the body bytes received."""
    s.settimeout(30)
    got = have
    try:
        while got < length:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    return got


def _wait_released(g: GatewayProcess, deadline_s: float) -> float:
    """Sample the send charge until it is 0 or the deadline passed (no event of another process to await)."""
    deadline = time.monotonic() + deadline_s
    while (held := _metric(g, "kcg_memory_budget_used_bytes", "send")) and time.monotonic() < deadline:
        time.sleep(0.25)
    return held


def _attack(g: GatewayProcess, targets: list[str], polls: bool = False) -> None:
    """Connections that never read (all at once; for polls each after the previous answer began); while they hold
    their answers, RSS stays within the budget, another client is served (/healthz, and a small range read:
    the pages' charges leave room for it; poll answers are charged at their rendered size, which may fill the
    budget, so there the neighbour reads partition offsets, which need no memory charge); after the send
    timeout the answered ones are closed."""
    with httpx.Client(timeout=60) as c:  # warm up (one page of each kind rendered, so the baseline has its code)
        assert c.get(f"{g.url}/topics/{SMALL}/partitions/0/records", params={"offset": 0},
                     headers=BINARY).status_code == 200
    base = _status(g, "VmHWM")
    socks: list[socket.socket] = []
    heads: list[tuple[int, int, int]] = []
    try:
        for t in targets:
            socks.append(_no_reader(g, t))
            if polls:
                heads.append(_head(socks[-1]))
        if not polls:
            heads = [_head(s) for s in socks]
        codes = [h[0] for h in heads]
        assert set(codes) <= {200, 503} and 200 in codes, codes
        answered = [(s, h) for s, h in zip(socks, heads, strict=True) if h[0] == 200]
        growth = _status(g, "VmHWM") - base
        assert growth <= BUDGET + MARGIN, f"peak RSS grew by {growth / MiB:.0f} MiB ({codes.count(200)} answered)"
        # other clients are served meanwhile
        with httpx.Client(timeout=30) as c:
            t0 = time.monotonic()
            assert c.get(f"{g.url}/healthz").status_code == 200
            if polls:
                r = c.get(f"{g.url}/topics/{SMALL}/partitions/0/offsets")
                assert r.status_code == 200 and r.json()["end_offset"] == 10, r.text[:200]
            else:
                r = c.get(f"{g.url}/topics/{SMALL}/partitions/0/records", params={"offset": 0, "max_bytes": 1024},
                          headers=BINARY)
                assert r.status_code == 200 and r.json()["records"], r.text[:200]
            assert time.monotonic() - t0 < SEND_TIMEOUT_S, "the neighbour waited for the attackers"
        # the connections that do not drain are closed after the send timeout, and their charge given back
        assert _wait_released(g, SEND_TIMEOUT_S * 4) == 0
        for s, (_, length, have) in answered:
            got = _read_to_end(s, length, have)
            assert got < length, "a connection that did not read its answer was kept open"
    finally:
        for s in socks:
            s.close()


def test_range_pages_not_read_stay_in_the_budget(gw: GatewayProcess) -> None:
    _attack(gw, [f"/topics/{TOPIC}/partitions/0/records?offset={i % 8}&max_bytes={8 * MiB}"
                 for i in range(ATTACKERS)])


def test_poll_answers_not_read_stay_in_the_budget(gw: GatewayProcess) -> None:
    targets = []
    with httpx.Client(timeout=30) as c:
        for i in range(POLLERS):
            group, name = f"outbudget-g{i}", "c"
            # each poll waits until 6 MiB are buffered (or its timeout): large answers
            r = c.post(f"{gw.url}/consumers/{group}", headers=V2, json={
                "name": name, "format": "binary", "auto.offset.reset": "earliest", "fetch.min.bytes": 6 * MiB})
            assert r.status_code == 200, r.text
            base_uri = f"{gw.url}/consumers/{group}/instances/{name}"
            assert c.post(f"{base_uri}/assignments", headers=V2, json={
                "partitions": [{"topic": TOPIC, "partition": 0}]}).status_code == 204
            targets.append(f"/consumers/{group}/instances/{name}/records?timeout=5000&max_bytes={8 * MiB}")
    _attack(gw, targets, polls=True)


def test_produce_of_too_many_records_is_refused_whole(gw: GatewayProcess) -> None:
    body = b'{"records":[' + b",".join([b"{}"] * 340_000) + b"]}"
    assert len(body) < 1024 * 1024  # under GATEWAY_MAX_BODY_BYTES: only the record cap refuses it
    with httpx.Client(timeout=60) as c:
        ok = c.post(f"{gw.url}/topics/{CAP_TOPIC}", content=b'{"records":[{}]}',
                    headers={"Content-Type": "application/vnd.kafka.binary.v2+json"})  # warm up: one record
        assert ok.status_code == 200, ok.text
        base = _status(gw, "VmHWM")
        for ct in ("application/vnd.kafka.binary.v2+json", "application/vnd.kafka.json.v2+json"):
            for path in (f"/topics/{CAP_TOPIC}", f"/topics/{CAP_TOPIC}/partitions/0"):
                r = c.post(f"{gw.url}{path}", content=body, headers={"Content-Type": ct})
                assert r.status_code == 413, (ct, path, r.status_code, r.text[:200])
                err = r.json()
                assert err["error_code"] == 41303 and "10000" in err["message"], err
            # a chunked body (no Content-Length) goes through the framework's route: the same answer
            r = c.post(f"{gw.url}/topics/{CAP_TOPIC}", content=iter([body[:1000], body[1000:]]),
                       headers={"Content-Type": ct})
            assert r.status_code == 413 and r.json()["error_code"] == 41303, (ct, r.text[:200])
        growth = _status(gw, "VmHWM") - base
        # the JSON path parses the body (~25 MB of empty dicts) before counting; the C path stops at the cap
        assert growth <= 40 * MiB, f"peak RSS grew by {growth / MiB:.0f} MiB"
        # nothing was written: the end offset is still 1 (the warm-up record)
        r = c.get(f"{gw.url}/topics/{CAP_TOPIC}/partitions/0/offsets")
        assert r.status_code == 200, r.text
        assert r.json()["end_offset"] == 1, r.json()
        # at the cap, a request is served
        r = c.post(f"{gw.url}/topics/{CAP_TOPIC}", content=b'{"records":[' + b",".join([b"{}"] * 10_000) + b"]}",
                   headers={"Content-Type": "application/vnd.kafka.binary.v2+json"})
        assert r.status_code == 200 and len(r.json()["offsets"]) == 10_000, r.text[:200]


def test_produce_cap_binary_lean_path_raw_socket(gw: GatewayProcess) -> None:
    """The protocol-level produce path (httptools, Content-Length body): the same 413/41303 on a kept-alive
    connection, which then serves the next request."""
    body = b'{"records":[' + b",".join([b'{"value":null}'] * 10_001) + b"]}"
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=30)
    try:
        req = (f"POST /topics/{CAP_TOPIC} HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n"
               f"Content-Type: application/vnd.kafka.binary.v2+json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        s.sendall(req + body + f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n\r\n".encode())
        data = b""
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"}"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        first, _, second = data.partition(b"HTTP/1.1 200")
        assert first.startswith(b"HTTP/1.1 413"), first
        assert orjson.loads(first.split(b"\r\n\r\n", 1)[1])["error_code"] == 41303
        assert second.endswith(b'{"status":"ok"}'), second
    finally:
        s.close()
