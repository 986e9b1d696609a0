"""One memory budget covers everything a client can make the gateway hold.

A real gateway with ``GATEWAY_MEMORY_BUDGET_BYTES`` lowered to ``BUDGET`` over a topic of ``DATA`` bytes:

- many concurrent range reads with large pages: at most the budget is in use; the rest wait
  ``GATEWAY_MEMORY_WAIT_S`` and are answered 503/50305 with ``Retry-After`` (none fails otherwise), while a
  client without a body keeps being served; peak RSS grows by at most the budget plus ``MARGIN``;
- many concurrent slow produce bodies: charged as declared; those that do not fit are refused 503/50305
  before their body is read, the others complete; RSS bounded the same way;
- consumer instances asking ``fetch.max.bytes`` / ``max.partition.fetch.bytes`` of 2^31-1 and never polling
  again: their fetches are clamped and granted from the budget, so their prefetch stays within its share.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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
MARGIN = 48 * MiB  # allocator slack, the interpreter's own growth, sockets, the neighbour's reads
TOPIC = "budget-big"
BATCHES = 24  # of 1 MiB each
RECORD = 64 * 1024
V2 = {"Content-Type": "application/vnd.kafka.v2+json"}
BINARY = {"Accept": "application/vnd.kafka.binary.v2+json"}


async def _setup(bootstrap: str) -> None:
    client = KafkaClient(bootstrap)
    try:
        await client.create_topics({TOPIC: 1, "budget-small": 1})
        await client.refresh_metadata({TOPIC, "budget-small"})
        node = client.metadata.leader(TOPIC, 0)
        assert node is not None
        conn = await client.connection(node).get()
        for i in range(BATCHES):
            batch = R.build_batch([(None, bytes([i % 251]) * RECORD) for _ in range(MiB // RECORD)])
            resp = await conn.send(produce_request(TOPIC, 0, batch), 9)
            assert resp.responses[0].partition_responses[0].error_code == 0
        small = R.build_batch([(None, b"s-%d" % i) for i in range(10)])
        resp = await conn.send(produce_request("budget-small", 0, small), 9)
        assert resp.responses[0].partition_responses[0].error_code == 0
    finally:
        await client.close()


@pytest.fixture(scope="module")
def gw(tansu: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    asyncio.run(_setup(tansu.bootstrap))
    log = Path(tmp_path_factory.mktemp("budget")) / "gateway.log"
    g = GatewayProcess(tansu.bootstrap, log_file=log, env={
        # a short wait: a page is read and rendered in ~10-25 ms now, so with 0.3 s the queued pages all got their
        # turn and none was refused (the test then proves nothing about refusals)
        "GATEWAY_MEMORY_BUDGET_BYTES": str(BUDGET), "GATEWAY_MEMORY_WAIT_S": "0.05",
        "GATEWAY_DEFAULT_REQUESTS_PER_SECOND": "0", "GATEWAY_DEFAULT_MAX_RANGE_READS": "0",
        "GATEWAY_DEFAULT_MAX_CONCURRENT_POLLS": "0"})
    with g:
        yield g


def _hwm(g: GatewayProcess) -> int:
    assert g.proc is not None
    for line in Path(f"/proc/{g.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _metric(g: GatewayProcess, name: str, label: str) -> float:
    text = httpx.get(f"{g.url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{kind="{label}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{kind={label!r}}} not exported")


def _neighbour(g: GatewayProcess, stop: float) -> list[int]:
    """A client without a request body (range reads of a small topic) during the attack."""
    out = []
    with httpx.Client(timeout=30) as c:
        while time.monotonic() < stop:
            r = c.get(f"{g.url}/topics/budget-small/partitions/0/records", params={"offset": 0, "max_bytes": 1024},
                      headers=BINARY)
            out.append(r.status_code)
    return out


def test_concurrent_range_pages_stay_within_the_budget(gw: GatewayProcess) -> None:
    url = f"{gw.url}/topics/{TOPIC}/partitions/0/records"
    with httpx.Client(timeout=60) as c:  # warm up
        r = c.get(url, params={"offset": 0, "max_bytes": 2 * MiB}, headers=BINARY)
        assert r.status_code == 200 and r.json()["records"]
    base = _hwm(gw)

    def attack(i: int) -> httpx.Response:
        with httpx.Client(timeout=60) as c:
            return c.get(url, params={"offset": i % 8, "max_bytes": 8 * MiB}, headers=BINARY)

    with ThreadPoolExecutor(18) as pool:
        side = pool.submit(_neighbour, gw, time.monotonic() + 3)
        got = list(pool.map(attack, range(16)))
        neighbour = side.result()
    codes = sorted(r.status_code for r in got)
    refused = [r for r in got if r.status_code == 503]
    assert set(codes) <= {200, 503} and 200 in codes and refused, codes
    for r in refused:
        assert r.json()["error_code"] == 50305 and "memory budget" in r.json()["message"], r.text
        assert int(r.headers["retry-after"]) >= 1
    for r in got:
        if r.status_code == 200:
            assert r.json()["records"], "a page that got memory is answered in full"
    # a page charges 3 x max_bytes: 24 MiB of a 32 MiB budget, so at most one ran at a time and the
    # neighbour's small pages (3 KiB) fit beside it
    assert neighbour and set(neighbour) == {200}, neighbour
    growth = _hwm(gw) - base
    assert growth <= BUDGET + MARGIN, f"peak RSS grew by {growth / MiB:.0f} MiB"
    assert _metric(gw, "kcg_memory_budget_refusals_total", "range") >= len(refused)
    assert _metric(gw, "kcg_memory_budget_used_bytes", "range") == 0  # everything given back


def _slow_produce(g: GatewayProcess, body: bytes, hold: float) -> tuple[int, bytes]:
    """POST a produce body declared up front, sending its first bytes, then the rest after ``hold`` seconds
    (unless the gateway answered already)."""
    s = socket.create_connection(("127.0.0.1", g.port), timeout=30)
    try:
        head = (f"POST /topics/budget-small HTTP/1.1\r\nHost: 127.0.0.1:{g.port}\r\n"
                f"Content-Type: application/vnd.kafka.binary.v2+json\r\nContent-Length: {len(body)}\r\n\r\n")
        s.sendall(head.encode() + body[:1000])
        s.settimeout(hold)
        try:
            early = s.recv(65536)
        except TimeoutError:
            early = b""
        if not early:
            s.settimeout(30)
            s.sendall(body[1000:])
            early = s.recv(65536)
        status = int(early.split(b" ", 2)[1])
        while b"\r\n\r\n" not in early:
            early += s.recv(65536)
        head_end = early.index(b"\r\n\r\n") + 4
        length = next(int(line.split(b":")[1]) for line in early[:head_end].split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        payload = early[head_end:]
        while len(payload) < length:
            payload += s.recv(65536)
        return status, payload
    finally:
        s.close()


def test_concurrent_produce_bodies_stay_within_the_budget(gw: GatewayProcess) -> None:
    value = base64.b64encode(b"x" * (700 * 1024)).decode()
    body = orjson.dumps({"records": [{"value": value}]})
    assert len(body) < 1024 * 1024  # under GATEWAY_MAX_BODY_BYTES: only the budget refuses
    base = _hwm(gw)
    n = 40  # 2 x ~0.93 MiB charged each: about 17 fit in 32 MiB
    with ThreadPoolExecutor(n + 1) as pool:
        side = pool.submit(_neighbour, gw, time.monotonic() + 2)
        got = list(pool.map(lambda _: _slow_produce(gw, body, 1.5), range(n)))
        neighbour = side.result()
    codes = [s for s, _ in got]
    assert set(codes) <= {200, 503} and 200 in codes and 503 in codes, codes
    assert codes.count(200) <= BUDGET // (2 * len(body)), codes
    for status, payload in got:
        if status == 503:
            assert b'"error_code":50305' in payload.replace(b" ", b""), payload
    assert neighbour and set(neighbour) == {200}, neighbour
    growth = _hwm(gw) - base
    assert growth <= BUDGET + MARGIN, f"peak RSS grew by {growth / MiB:.0f} MiB"
    assert _metric(gw, "kcg_memory_budget_used_bytes", "body") == 0
    # and with room again, a produce is accepted at once
    r = httpx.post(f"{gw.url}/topics/budget-small", content=body,
                   headers={"Content-Type": "application/vnd.kafka.binary.v2+json"}, timeout=30)
    assert r.status_code == 200, r.text


def test_huge_client_fetch_sizes_are_clamped_and_prefetch_stays_within_its_share(gw: GatewayProcess) -> None:
    base = _hwm(gw)
    with httpx.Client(timeout=30) as c:
        for i in range(8):
            group, name = f"budget-g{i}", "c"
            r = c.post(f"{gw.url}/consumers/{group}", headers=V2, json={
                "name": name, "format": "binary", "auto.offset.reset": "earliest",
                "fetch.max.bytes": 2**31 - 1, "max.partition.fetch.bytes": 2**31 - 1})
            assert r.status_code == 200, r.text
            base_uri = f"{gw.url}/consumers/{group}/instances/{name}"
            assert c.post(f"{base_uri}/subscription", headers=V2, json={"topics": [TOPIC]}).status_code == 204
            got: list[Any] = []
            deadline = time.monotonic() + 20
            while not got and time.monotonic() < deadline:  # the first poll may end while the group forms
                r = c.get(f"{base_uri}/records", params={"timeout": 2000, "max_bytes": 1}, headers=BINARY)
                assert r.status_code == 200, r.text[:200]
                got = r.json()
            assert len(got) == 1, got
        # the instances now prefetch (each wants the whole 24 MiB partition) and are never polled again;
        # wait until the prefetch stops growing
        deadline = time.monotonic() + 20
        last = -1.0
        while time.monotonic() < deadline:
            now = _metric(gw, "kcg_memory_budget_used_bytes", "prefetch")
            if now == last and now > 0:
                break
            last = now
            time.sleep(1.0)  # sampling a metric of another process: no event to await
        prefetch = _metric(gw, "kcg_memory_budget_used_bytes", "prefetch")
        in_flight = _metric(gw, "kcg_memory_budget_used_bytes", "fetch")
        # at most the prefetch share (3/4 of the budget) plus one batch per instance past a grant
        assert 0 < prefetch + in_flight <= BUDGET * 3 // 4 + 8 * MiB, (prefetch, in_flight)
        growth = _hwm(gw) - base
        assert growth <= BUDGET + MARGIN, f"peak RSS grew by {growth / MiB:.0f} MiB"
        # the instances still work: one reads on
        r = c.get(f"{gw.url}/consumers/budget-g0/instances/c/records", params={"timeout": 3000}, headers=BINARY)
        assert r.status_code == 200 and r.json(), r.text[:200]
